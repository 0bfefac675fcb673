import type { SqlClient, Statement } from "effect/sql"

/**
 * A list of ids for `IN`, sent as one bind parameter (a JSON array), for lists with no bound: `sql.in` binds
 * one parameter per id, and the protocol allows at most 32,767, so a provider's payout over more shares than
 * that failed to encode, every pass, and was never paid (D556). A subquery, not `= ANY(array)`: the planner
 * makes it a semi-join, where an array left as a filter is searched once per row the plan reads (40,000 due
 * refunds read through their status index took 27 s).
 */
export const idList = (sql: SqlClient.SqlClient, ids: ReadonlyArray<string>): Statement.Fragment =>
  sql`(SELECT jsonb_array_elements_text(${JSON.stringify(ids)}::jsonb))`
