import { Schema } from "effect"

/** `GET /health`: the process is up, on which network, under which auction mechanism. */
export const Health = Schema.Struct({
  status: Schema.Literal("ok"),
  network: Schema.String,
  auction_version: Schema.String,
  router_signer: Schema.String
})

/** Reconciliation status in `/ready` (spec 3.3). */
export const ReconciliationStatus = Schema.Literals(["not_run", "running", "ok", "failed"])

const Dependency = Schema.Struct({
  status: Schema.Literals(["up", "down"]),
  detail: Schema.optionalKey(Schema.String)
})

const readinessFields = {
  /** `draining`: the instance is shutting down and admits no new paid work (503). */
  status: Schema.Literals(["ready", "not_ready", "draining"]),
  database: Dependency,
  chain: Dependency,
  reconciliation: Schema.Struct({
    status: ReconciliationStatus,
    last_run_at: Schema.NullOr(Schema.Number),
    discrepancies: Schema.Array(Schema.Unknown)
  })
}

/** `GET /ready`: every dependency and the reconciliation gate. */
export const Readiness = Schema.Struct(readinessFields)
export type Readiness = typeof Readiness.Type

/** `/ready` answers 503 with the same structured body when a gate is down. */
export class NotReady extends Schema.TaggedError<NotReady>()("NotReady", readinessFields, {
  httpApiStatus: 503
}) {}
