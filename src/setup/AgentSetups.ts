import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { type Hex, verifyTypedData } from "viem"
import { Conflict, Forbidden, type InvalidRequest, type NotFound, Unauthorized } from "../domain/Errors.ts"
import type { DeviceFlowError, Harness } from "../domain/Setup.ts"
import { harnessNames } from "../domain/Setup.ts"
import { Keys } from "../payment/Keys.ts"
import { APPROVAL_PRIMARY_TYPE, approvalDomain, approvalMessage, approvalTypes } from "./Approval.ts"
import { hashCode, newDeviceCode, newUserCode } from "./DeviceFlow.ts"
import { at, invalid, makeSetupRecords, type SetupView } from "./SetupRecords.ts"
import { SetupSettings } from "./SetupSettings.ts"
import { type Issued, makeTokenExchange, type TokenRequest } from "./TokenExchange.ts"

export type { SetupView } from "./SetupRecords.ts"
export type { Issued, TokenRequest } from "./TokenExchange.ts"

export interface StartInput {
  readonly harness: Harness
  /** Base units. */
  readonly budget: number
  readonly network?: string | undefined
  readonly keyExpiresIn?: number | undefined
  readonly wallet?: string | undefined
  readonly label?: string | undefined
}

export interface Started {
  readonly deviceCode: string
  readonly intervalSeconds: number
  readonly expiresIn: number
  readonly setup: SetupView
}

export interface Approval {
  readonly wallet: string
  /** Base units: at most the budget asked. */
  readonly budget: number
  readonly signature: string
}

/** Rows older than this past their expiry are swept, unless they issued a key (kept as the audit trail). */
const KEEP_EXPIRED_MS = 24 * 3600 * 1000

/**
 * The device-flow setup of spec 4.5, modelled on RFC 8628. `start` (no credential) stores the requested
 * terms with both codes hashed; the wallet approves exactly those terms by an EIP-712 signature (and may
 * lower the budget); `exchange` trades the device code, once, for a normal wallet-owned credit key capped
 * at the approved budget and expiring when the wallet said. Time is the router's `Clock` throughout.
 */
export class AgentSetups extends Context.Service<
  AgentSetups,
  {
    readonly start: (input: StartInput) => Effect.Effect<Started, InvalidRequest>
    readonly view: (userCode: string) => Effect.Effect<SetupView, InvalidRequest | NotFound>
    readonly approve: (
      userCode: string,
      approval: Approval
    ) => Effect.Effect<SetupView, InvalidRequest | NotFound | Unauthorized | Forbidden | Conflict>
    readonly deny: (userCode: string) => Effect.Effect<SetupView, InvalidRequest | NotFound | Conflict>
    readonly exchange: (request: TokenRequest) => Effect.Effect<Issued, DeviceFlowError>
  }
>()("router/setup/AgentSetups") {
  static readonly layer = Layer.effect(
    AgentSetups,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const keys = yield* Keys
      const settings = yield* SetupSettings

      const nowMs = Clock.currentTimeMillis
      const records = makeSetupRecords(sql, settings)
      const { select, toView, undecided } = records
      const exchange = makeTokenExchange(sql, keys, records)

      const view = Effect.fn("AgentSetups.view")(function* (userCode: string) {
        const found = yield* records.find(userCode)
        return toView(found.row, found.userCode, yield* nowMs)
      })

      const start = Effect.fn("AgentSetups.start")(function* (input: StartInput) {
        if (input.network !== undefined && input.network !== settings.network) {
          return yield* invalid(
            "unsupported_network",
            "network",
            `This router settles on ${settings.network}; a setup can only name that network`
          )
        }
        const { keyTtl } = settings
        const keyExpiresIn = input.keyExpiresIn ?? keyTtl.default
        if (keyExpiresIn < keyTtl.min || keyExpiresIn > keyTtl.max) {
          return yield* invalid(
            "invalid_key_expiry",
            "key_expires_in",
            `key_expires_in must be between ${keyTtl.min} and ${keyTtl.max} seconds`
          )
        }
        const now = yield* nowMs
        const setupId = `0x${randomBytes(32).toString("hex")}`
        const deviceCode = newDeviceCode()
        const label = input.label ?? `${harnessNames[input.harness]} (agent setup)`
        const keyExpiresAt = Math.floor(now / 1000) + keyExpiresIn
        const expiresAtMs = now + settings.setupTtlSeconds * 1000
        // A user code collides with a live one about once in 10^10 setups: draw again.
        const insert = (userCode: string) =>
          sql`
            INSERT INTO agent_setups (setup_id, device_code_hash, user_code_hash, harness, network, label,
              budget, key_expires_at, wallet, status, interval_s, created_at, expires_at)
            VALUES (${setupId}, ${hashCode(deviceCode)}, ${hashCode(userCode)}, ${input.harness},
              ${settings.network}, ${label}, ${input.budget}, ${at(keyExpiresAt * 1000)},
              ${input.wallet?.toLowerCase() ?? null}, 'pending', ${settings.intervalSeconds}, ${at(now)},
              ${at(expiresAtMs)})
          `.pipe(Effect.as(userCode))
        const userCode = yield* Effect.suspend(() => insert(newUserCode())).pipe(
          Effect.retry({
            times: 4,
            while: (error) => error.reason._tag === "UniqueViolation"
          }),
          Effect.orDie
        )
        yield* sql`
          DELETE FROM agent_setups WHERE expires_at < ${at(now - KEEP_EXPIRED_MS)} AND status <> 'exchanged'
        `.pipe(Effect.orDie)
        const [row] = yield* select(sql`setup_id = ${setupId}`)
        return {
          deviceCode,
          intervalSeconds: settings.intervalSeconds,
          expiresIn: settings.setupTtlSeconds,
          setup: toView(row!, userCode, now)
        } satisfies Started
      })

      const decide = (current: SetupView, now: number, set: Statement.Fragment) =>
        Effect.gen(function* () {
          const updated = yield* sql<{ setup_id: string }>`
            UPDATE agent_setups SET ${set}, decided_at = ${at(now)}
            WHERE setup_id = ${current.setupId} AND status = 'pending' AND expires_at > ${at(now)}
            RETURNING setup_id
          `.pipe(Effect.orDie)
          if (updated.length === 0) {
            return yield* new Conflict({
              code: "setup_already_decided",
              param: "code",
              message: "This setup was decided or expired a moment ago; nothing was changed"
            })
          }
          const [after] = yield* select(sql`setup_id = ${current.setupId}`)
          return toView(after!, current.userCode, now)
        })

      const approve = Effect.fn("AgentSetups.approve")(function* (userCode: string, approval: Approval) {
        const { row, current, now } = yield* undecided(userCode)
        if (approval.budget > row.budget) {
          return yield* invalid(
            "budget_above_request",
            "budget",
            `The approved budget may lower the ${row.budget} base units asked, never raise it`
          )
        }
        const signed = yield* Effect.tryPromise(() =>
          verifyTypedData({
            address: approval.wallet as Hex,
            domain: approvalDomain(settings.chainId),
            types: approvalTypes,
            primaryType: APPROVAL_PRIMARY_TYPE,
            message: approvalMessage({ ...current, budget: approval.budget }, approval.wallet),
            signature: approval.signature as Hex
          })
        ).pipe(Effect.orElseSucceed(() => false))
        if (!signed) {
          return yield* new Unauthorized({
            code: "invalid_approval_signature",
            message: "signature is not an AgentSetupApproval signed by wallet over this setup's terms"
          })
        }
        const wallet = approval.wallet.toLowerCase()
        if (row.wallet !== null && row.wallet !== wallet) {
          return yield* new Forbidden({
            code: "wrong_wallet",
            message: `This setup asked for wallet ${row.wallet} to approve it`
          })
        }
        if (!(yield* keys.isInvited(wallet))) {
          return yield* new Forbidden({
            code: "wallet_not_invited",
            message: "Only an invited wallet can approve a spend key; ask the operator for an invite"
          })
        }
        return yield* decide(
          current,
          now,
          sql`status = 'approved', approved_by = ${wallet}, approved_budget = ${approval.budget},
              approval_signature = ${approval.signature.toLowerCase()}`
        )
      })

      const deny = Effect.fn("AgentSetups.deny")(function* (userCode: string) {
        const { current, now } = yield* undecided(userCode)
        return yield* decide(current, now, sql`status = 'denied'`)
      })

      return AgentSetups.of({ start, view, approve, deny, exchange })
    })
  )
}
