import type { Effect } from "effect"
import type { SqlClient } from "effect/sql"

/** Migrations by id ("0001_name"): each runs once, in id order; a schema change is a new entry, never an edit. */
export type Migrations = Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>>
