import { Clock, Effect, Schema } from "effect"
import type { SqlClient, Statement } from "effect/sql"
import { Conflict, InvalidRequest, NotFound } from "../domain/Errors.ts"
import { Harness, type SetupStatus } from "../domain/Setup.ts"
import type { ApprovalTerms } from "./Approval.ts"
import { hashCode, normalizeUserCode } from "./DeviceFlow.ts"
import type { SetupSettings } from "./SetupSettings.ts"

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
export type SetupRow = typeof SetupRow.Type
const decodeRows = Schema.decodeUnknownEffect(Schema.Array(SetupRow))

export const at = (ms: number) => new Date(ms)

export const invalid = (code: string, param: string, message: string) =>
  new InvalidRequest({ code, param, message })

/** How a setup is read: its row (both codes only hashed), the view of it, and the setup a user code names. */
export interface SetupRecords {
  readonly select: (where: Statement.Fragment, lock?: boolean) => Effect.Effect<ReadonlyArray<SetupRow>>
  /** The user code is not stored (only its hash): the caller who named the setup by it supplies it. */
  readonly toView: (row: SetupRow, userCode: string, now: number) => SetupView
  /** The setup a user code names: the undecided one if there is one, else the latest. */
  readonly find: (
    userCode: string
  ) => Effect.Effect<{ readonly row: SetupRow; readonly userCode: string }, InvalidRequest | NotFound>
  /** The setup as a decision may still change it: live, undecided. */
  readonly undecided: (
    userCode: string
  ) => Effect.Effect<
    { readonly row: SetupRow; readonly current: SetupView; readonly now: number },
    InvalidRequest | NotFound | Conflict
  >
}

export const makeSetupRecords = (
  sql: SqlClient.SqlClient,
  settings: SetupSettings["Service"]
): SetupRecords => {
  const nowMs = Clock.currentTimeMillis

  const select = (where: Statement.Fragment, lock = false) =>
    sql`
      SELECT setup_id, harness, network, label, budget::text AS budget,
        extract(epoch FROM key_expires_at)::bigint::text AS key_expires_at, wallet, status, interval_s,
        (extract(epoch FROM expires_at) * 1000)::bigint::text AS expires_at_ms,
        (extract(epoch FROM last_polled_at) * 1000)::bigint::text AS last_polled_at_ms,
        approved_by, approved_budget::text AS approved_budget
      FROM agent_setups WHERE ${where} ${lock ? sql`FOR UPDATE` : sql``}
    `.pipe(Effect.flatMap(decodeRows), Effect.orDie)

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

  return { select, toView, find, undecided }
}
