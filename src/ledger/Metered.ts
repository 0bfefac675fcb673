import { Effect, Schema } from "effect"
import type { SqlClient, SqlError } from "effect/sql"
import type { Tariff, TokenCounts } from "../domain/Billing.ts"

/**
 * What a request has delivered, kept on its `requests` row while it is `reserved` (migration 0029,
 * docs/decisions.md D211): the charge its metered tokens bill at its tariff, and who served them. The
 * serve step writes a checkpoint `METER_CHECKPOINT_MS` after the first token and then at most that often; a
 * settlement that cannot be written writes the final one (`final: true`). Whoever settles the request
 * later (the background retry, the reaper, the restart of a dead instance) bills this, never nothing.
 */
export const MeterRecord = Schema.Struct({
  charged: Schema.Number,
  tokens: Schema.Struct({ input: Schema.Number, cachedInput: Schema.Number, output: Schema.Number }),
  provider_id: Schema.String,
  model_class: Schema.String,
  tariff: Schema.Struct({
    price_in: Schema.Number,
    price_out: Schema.Number,
    price_in_cached: Schema.optionalKey(Schema.NullOr(Schema.Number))
  }),
  ttft_ms: Schema.Number,
  /** `partial` for a checkpoint (the request may still be serving); the final record says how it ended. */
  status: Schema.Literals(["ok", "partial", "released"]),
  final: Schema.Boolean
})
export type MeterRecord = typeof MeterRecord.Type

/** The longest a delivered charge goes unrecorded while tokens keep arriving. */
export const METER_CHECKPOINT_MS = 1000

export interface MeterFacts {
  readonly charged: number
  readonly tokens: TokenCounts
  readonly providerId: string
  readonly modelClass: string
  readonly tariff: Tariff
  readonly ttftMs: number
  readonly status: MeterRecord["status"]
  readonly final: boolean
}

export const meterRecordOf = (facts: MeterFacts): MeterRecord => ({
  charged: facts.charged,
  tokens: facts.tokens,
  provider_id: facts.providerId,
  model_class: facts.modelClass,
  tariff: {
    price_in: facts.tariff.price_in,
    price_out: facts.tariff.price_out,
    ...(facts.tariff.price_in_cached == null ? {} : { price_in_cached: facts.tariff.price_in_cached })
  },
  ttft_ms: facts.ttftMs,
  status: facts.status,
  final: facts.final
})

/**
 * One statement, on the row's primary key: only a request still `reserved` takes it (a late checkpoint
 * never touches a settled request), and a final record is never overwritten by a checkpoint.
 */
export const makeMeterStore = (sql: SqlClient.SqlClient) => ({
  recordMeter: (requestId: string, record: MeterRecord): Effect.Effect<void, SqlError.SqlError> =>
    sql`
      UPDATE requests SET metered = ${JSON.stringify(record)}::jsonb
      WHERE request_id = ${requestId} AND status = 'reserved'
        AND (metered IS NULL OR NOT (metered->>'final')::boolean)
    `.pipe(Effect.asVoid)
})
