import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"

export const AUCTION_VERSION = "second-score/1"

export const Health = Schema.Struct({
  status: Schema.Literal("ok"),
  network: Schema.String,
  auction_version: Schema.String,
  router_signer: Schema.String
})

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
export const Readiness = Schema.Struct(readinessFields)
export type Readiness = typeof Readiness.Type

/** `/ready` answers 503 with the same structured body when a gate is down. */
export class NotReady extends Schema.TaggedError<NotReady>()("NotReady", readinessFields, {
  httpApiStatus: 503
}) {}

export class SystemApi extends HttpApiGroup.make("system", { topLevel: true }).add(
  HttpApiEndpoint.get("health", "/health", { success: Health }),
  HttpApiEndpoint.get("ready", "/ready", { success: Readiness, error: NotReady }),
  HttpApiEndpoint.get("metrics", "/metrics", {
    success: Schema.String.pipe(
      HttpApiSchema.asText({ contentType: "text/plain; version=0.0.4; charset=utf-8" })
    )
  })
) {}
