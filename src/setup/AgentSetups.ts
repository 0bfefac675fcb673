import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { type Hex, verifyTypedData } from "viem"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import {
  DEVICE_CODE_GRANT,
  DeviceFlowError,
  type DeviceFlowErrorCode,
  Harness,
  harnessNames,
  type SetupStatus
} from "../domain/Setup.ts"
import { Keys } from "../payment/Keys.ts"
import {
  APPROVAL_PRIMARY_TYPE,
  type ApprovalTerms,
  approvalDomain,
  approvalMessage,
  approvalTypes
} from "./Approval.ts"
import {
  hashCode,
  newDeviceCode,
  newUserCode,
  normalizeUserCode,
  POLITE_SHARE,
  SLOW_DOWN_STEP_S
} from "./DeviceFlow.ts"
import { SetupSettings } from "./SetupSettings.ts"

/** A setup as the approval page and the requester see it: terms and state, never a code's secret half. */
export interface SetupView extends ApprovalTerms {
  readonly status: SetupStatus
  readonly chainId: number
  readonly label: string
  /** The wallet the requester named as the only approver, if any (lowercase). */
  readonly wallet: string | null
  /** Unix seconds: the setup must be approved and exchanged before this. */
  readonly expiresAt: number
  readonly approvedBy: string | null
  readonly approvedBudget: number | null
}

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

const SetupRow = Schema.Struct({
  setup_id: Schema.String,
  harness: Harness,
  network: Schema.String,
  label: Schema.String,
  budget: Schema.NumberFromString,
  key_expires_at: Schema.NumberFromString,
  wallet: Schema.NullOr(Schema.String),
  status: Schema.Literals(["pending", "approved", "denied", "exchanged"]),
  interval_s: Schema.Number,
  expires_at_ms: Schema.NumberFromString,
  last_polled_at_ms: Schema.NullOr(Schema.NumberFromString),
  approved_by: Schema.NullOr(Schema.String),
  approved_budget: Schema.NullOr(Schema.NumberFromString)
})
type SetupRow = typeof SetupRow.Type
const decodeRows = Schema.decodeUnknownEffect(Schema.Array(SetupRow))

/** Rows older than this past their expiry are swept, unless they issued a key (kept as the audit trail). */
const KEEP_EXPIRED_MS = 24 * 3600 * 1000

const refuse = (error: DeviceFlowErrorCode, description: string) =>
  ({ _tag: "Refused", error, description }) as const

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
      const at = (ms: number) => new Date(ms)

      const select = (where: Statement.Fragment, lock = false) =>
        sql`
          SELECT setup_id, harness, network, label, budget::text AS budget,
            extract(epoch FROM key_expires_at)::bigint::text AS key_expires_at, wallet, status, interval_s,
            (extract(epoch FROM expires_at) * 1000)::bigint::text AS expires_at_ms,
            (extract(epoch FROM last_polled_at) * 1000)::bigint::text AS last_polled_at_ms,
            approved_by, approved_budget::text AS approved_budget
          FROM agent_setups WHERE ${where} ${lock ? sql`FOR UPDATE` : sql``}
        `.pipe(Effect.flatMap(decodeRows), Effect.orDie)

      /** The user code is not stored (only its hash): the caller who named the setup by it supplies it. */
      const toView = (row: SetupRow, userCode: string, now: number): SetupView => ({
        setupId: row.setup_id,
        userCode,
        harness: row.harness,
        network: row.network,
        budget: row.budget,
        keyExpiresAt: row.key_expires_at,
        status:
          (row.status === "pending" || row.status === "approved") && now >= row.expires_at_ms
            ? "expired"
            : row.status,
        chainId: settings.chainId,
        label: row.label,
        wallet: row.wallet,
        expiresAt: Math.floor(row.expires_at_ms / 1000),
        approvedBy: row.approved_by,
        approvedBudget: row.approved_budget
      })

      const invalid = (code: string, param: string, message: string) =>
        new InvalidRequest({ code, param, message })

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

      /** The setup a user code names: the undecided one if there is one, else the latest. */
      const find = Effect.fn("AgentSetups.find")(function* (userCode: string) {
        const canonical = normalizeUserCode(userCode)
        if (canonical === undefined) {
          return yield* invalid(
            "invalid_user_code",
            "code",
            "A user code is 8 letters as shown by the command that started the setup, e.g. BCDF-GHJK"
          )
        }
        const [row] = yield* select(
          sql`user_code_hash = ${hashCode(canonical)}
              ORDER BY status IN ('pending', 'approved') DESC, created_at DESC LIMIT 1`
        )
        if (row === undefined) {
          return yield* new NotFound({
            code: "setup_not_found",
            message: `No agent setup has the code ${canonical}; check the code your terminal shows`
          })
        }
        return { row, userCode: canonical }
      })

      const view = Effect.fn("AgentSetups.view")(function* (userCode: string) {
        const found = yield* find(userCode)
        return toView(found.row, found.userCode, yield* nowMs)
      })

      /** The setup as a decision may still change it: live, undecided. */
      const undecided = Effect.fn("AgentSetups.undecided")(function* (userCode: string) {
        const { row, userCode: canonical } = yield* find(userCode)
        const now = yield* nowMs
        const current = toView(row, canonical, now)
        if (current.status === "expired") {
          return yield* invalid(
            "setup_expired",
            "code",
            "This setup has expired; run the setup command again for a new code"
          )
        }
        if (current.status !== "pending") {
          return yield* new Conflict({
            code: "setup_already_decided",
            param: "code",
            message: `This setup is already ${current.status}; nothing was changed`
          })
        }
        return { row, current, now }
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
              row.last_polled_at_ms !== null &&
              now - row.last_polled_at_ms < row.interval_s * 1000 * POLITE_SHARE
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

      return AgentSetups.of({ start, view, approve, deny, exchange })
    })
  )
}
