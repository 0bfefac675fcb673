import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { DEVICE_CODE_GRANT, DeviceFlowError, type DeviceFlowErrorCode } from "../domain/Setup.ts"
import type { Keys } from "../payment/Keys.ts"
import { hashCode, POLITE_SHARE, SLOW_DOWN_STEP_S } from "./DeviceFlow.ts"
import { at, type SetupRecords } from "./SetupRecords.ts"

export interface TokenRequest {
  readonly grantType?: string | undefined
  readonly deviceCode?: string | undefined
}

/** The governed key a setup issued: the secret leaves the router once, in this answer. */
export interface Issued {
  readonly keyId: string
  readonly secret: string
  readonly wallet: string
  readonly label: string
  readonly budget: number
  readonly keyExpiresAt: number
  readonly expiresIn: number
}

const refuse = (error: DeviceFlowErrorCode, description: string) =>
  ({ _tag: "Refused", error, description }) as const

/**
 * The token endpoint's side of the device flow (RFC 8628 section 3.4): a poll before the decision answers
 * `authorization_pending` (or `slow_down`, widening the interval), and an approved setup's device code is
 * traded, once, for its governed key.
 */
export const makeTokenExchange = (sql: SqlClient.SqlClient, keys: Keys["Service"], records: SetupRecords) => {
  const nowMs = Clock.currentTimeMillis
  const { select } = records

  type Outcome = ReturnType<typeof refuse> | { readonly _tag: "Issued"; readonly issued: Issued }

  /** One transaction holding the setup's row lock: concurrent polls and exchanges queue behind it. */
  const settle = (deviceCode: string) =>
    Effect.gen(function* () {
      const [row] = yield* select(sql`device_code_hash = ${hashCode(deviceCode)}`, true)
      if (row === undefined) return refuse("invalid_grant", "Unknown device_code")
      if (row.status === "exchanged") {
        return refuse("invalid_grant", "This device_code was already exchanged for its key")
      }
      const now = yield* nowMs
      if (now >= row.expires_at_ms) {
        return refuse("expired_token", "The setup expired before it was approved; start a new one")
      }
      if (row.status === "denied") return refuse("access_denied", "The wallet holder denied this setup")
      if (row.status === "pending") {
        const early =
          row.last_polled_at_ms !== null && now - row.last_polled_at_ms < row.interval_s * 1000 * POLITE_SHARE
        const interval = early ? row.interval_s + SLOW_DOWN_STEP_S : row.interval_s
        yield* sql`
          UPDATE agent_setups SET last_polled_at = ${at(now)}, interval_s = ${interval}
          WHERE setup_id = ${row.setup_id}
        `
        return early
          ? refuse("slow_down", `Polling too fast: wait at least ${interval} seconds between polls`)
          : refuse("authorization_pending", "The wallet holder has not approved this setup yet")
      }
      const wallet = row.approved_by!
      const budget = row.approved_budget!
      const created = yield* keys
        .create(wallet, { label: row.label, budget, spend: true, expiresAt: row.key_expires_at })
        .pipe(Effect.option)
      if (created._tag === "None") {
        yield* sql`UPDATE agent_setups SET status = 'denied' WHERE setup_id = ${row.setup_id}`
        return refuse("access_denied", "The approving wallet is no longer invited to spend")
      }
      const { record, secret } = created.value
      yield* sql`
        UPDATE agent_setups SET status = 'exchanged', key_id = ${record.keyId}, exchanged_at = ${at(now)}
        WHERE setup_id = ${row.setup_id}
      `
      return {
        _tag: "Issued",
        issued: {
          keyId: record.keyId,
          secret,
          wallet,
          label: record.label,
          budget,
          keyExpiresAt: row.key_expires_at,
          expiresIn: Math.max(0, row.key_expires_at - Math.floor(now / 1000))
        }
      } satisfies Outcome
    })

  const exchange = Effect.fn("AgentSetups.exchange")(function* (request: TokenRequest) {
    if (request.grantType !== undefined && request.grantType !== DEVICE_CODE_GRANT) {
      return yield* new DeviceFlowError({
        error: "unsupported_grant_type",
        error_description: `grant_type must be ${DEVICE_CODE_GRANT}`
      })
    }
    if (request.deviceCode === undefined || request.deviceCode === "") {
      return yield* new DeviceFlowError({
        error: "invalid_request",
        error_description: "device_code is required"
      })
    }
    const outcome: Outcome = yield* sql.withTransaction(settle(request.deviceCode)).pipe(Effect.orDie)
    if (outcome._tag === "Refused") {
      return yield* new DeviceFlowError({ error: outcome.error, error_description: outcome.description })
    }
    return outcome.issued
  })

  return exchange
}
