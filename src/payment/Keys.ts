import { createHash, randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { Forbidden, NotFound, Unauthorized } from "../domain/Errors.ts"
import { traced } from "../Telemetry.ts"

export const USDC_DECIMALS = 6
export const BASE_UNIT = "base units of USDC (6 decimals)"

/**
 * A decimal USDC amount with at most 6 places, parsed exactly into base units. At most 9 integer digits,
 * so every amount (below 10^15 base units) is a safe integer.
 */
export const parseUsdc = (text: string): number | undefined => {
  const match = /^(\d{1,9})(?:\.(\d{1,6}))?$/.exec(text)
  if (match === null) return undefined
  return Number(match[1]) * 10 ** USDC_DECIMALS + Number((match[2] ?? "").padEnd(USDC_DECIMALS, "0"))
}

/** Base units as a decimal string with all 6 places: 1500000 → "1.500000". */
export const formatUsdc = (base: number): string => {
  const whole = Math.floor(base / 10 ** USDC_DECIMALS)
  const fraction = String(base % 10 ** USDC_DECIMALS).padStart(USDC_DECIMALS, "0")
  return `${whole}.${fraction}`
}

export const hashSecret = (secret: string) => createHash("sha256").update(secret, "utf8").digest("hex")

export const KeyKind = Schema.Literals(["credit", "api"])
export type KeyKind = typeof KeyKind.Type

/** A key as its owner sees it: never the secret. Times are unix seconds. */
export interface KeyRecord {
  readonly keyId: string
  readonly wallet: string
  readonly kind: KeyKind
  readonly label: string
  readonly budget: number
  readonly spent: number
  readonly reserved: number
  readonly requests: number
  readonly createdAt: number
  readonly revokedAt: number | null
  /** Past this time the key neither spends nor reads; null: it never expires. */
  readonly expiresAt: number | null
}

/** A spend-capable key that passed every gate (known, live, `credit`, owner invited). */
export interface CreditKey {
  readonly keyId: string
  readonly wallet: string
  readonly budget: number
  readonly spent: number
  readonly reserved: number
  readonly label: string
}

export interface CreateKeyInput {
  readonly label: string
  /** Base units. */
  readonly budget: number
  readonly spend: boolean
  /** Unix seconds; omitted: the key never expires. */
  readonly expiresAt?: number
}

const KeyRow = Schema.Struct({
  key_id: Schema.String,
  wallet: Schema.String,
  kind: KeyKind,
  label: Schema.String,
  budget: Schema.NumberFromString,
  spent: Schema.NumberFromString,
  reserved: Schema.NumberFromString,
  requests: Schema.NumberFromString,
  created_at: Schema.NumberFromString,
  revoked_at: Schema.NullOr(Schema.NumberFromString),
  expires_at: Schema.NullOr(Schema.NumberFromString),
  invited: Schema.Boolean
})
const decodeRows = Schema.decodeUnknownEffect(Schema.Array(KeyRow))

const toRecord = (row: typeof KeyRow.Type): KeyRecord => ({
  keyId: row.key_id,
  wallet: row.wallet,
  kind: row.kind,
  label: row.label,
  budget: row.budget,
  spent: row.spent,
  reserved: row.reserved,
  requests: row.requests,
  createdAt: row.created_at,
  revokedAt: row.revoked_at,
  expiresAt: row.expires_at
})

const notInvited = () =>
  new Forbidden({
    code: "wallet_not_invited",
    message: "This wallet is not invited to spend from prepaid credits; ask the operator for an invite"
  })

/** Why a credit key cannot spend, as a caller reads it: the one wording for every spending surface. */
export const creditKeyRefusal = (
  reason: "unknown" | "expired" | "cannot_spend" | "not_invited"
): Unauthorized | Forbidden => {
  switch (reason) {
    case "unknown":
      return new Unauthorized({ code: "invalid_credit_key", message: "Unknown or revoked x-credit-key" })
    case "expired":
      return keyExpired("credit_key_expired")
    case "cannot_spend":
      return new Forbidden({
        code: "key_cannot_spend",
        message: "This is a read-only API key; spending needs a credit key created with spend: true"
      })
    case "not_invited":
      return notInvited()
  }
}

const keyExpired = (code: string) =>
  new Unauthorized({ code, message: "This key has expired; ask its wallet for a new one" })

/**
 * Wallet invites and API keys as records. A key's secret is returned once at creation and only its
 * SHA-256 is stored; every lookup is by that hash, so revocation is effective on the next request.
 */
export class Keys extends Context.Service<
  Keys,
  {
    readonly setInvited: (
      wallet: string,
      invited: boolean
    ) => Effect.Effect<{ readonly wallet: string; readonly invited: boolean }>
    readonly isInvited: (wallet: string) => Effect.Effect<boolean>
    /** `spend` asks for a credit key: only an invited wallet gets one (else 403 `wallet_not_invited`). */
    readonly create: (
      wallet: string,
      input: CreateKeyInput
    ) => Effect.Effect<{ readonly record: KeyRecord; readonly secret: string }, Forbidden>
    readonly list: (wallet: string) => Effect.Effect<ReadonlyArray<KeyRecord>>
    /** Owner only (any other wallet sees 404); revoking twice keeps the first time. */
    readonly revoke: (wallet: string, keyId: string) => Effect.Effect<KeyRecord, NotFound>
    /**
     * For spending surfaces: 401 `invalid_credit_key` or `credit_key_expired`, 403 `key_cannot_spend` or
     * `wallet_not_invited`.
     */
    readonly resolveCreditKey: (secret: string) => Effect.Effect<CreditKey, Unauthorized | Forbidden>
    /** For read-only surfaces: a live key of either kind, else 401 `invalid_api_key` or `key_expired`. */
    readonly resolveApiKey: (secret: string) => Effect.Effect<KeyRecord, Unauthorized>
  }
>()("router/payment/Keys") {
  static readonly layer = Layer.effect(
    Keys,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient

      const columns = sql`
        k.key_id, k.wallet, k.kind, k.label, k.budget::text AS budget, f.spent::text AS spent,
        f.reserved::text AS reserved, k.requests::text AS requests,
        extract(epoch FROM k.created_at)::bigint::text AS created_at,
        extract(epoch FROM k.revoked_at)::bigint::text AS revoked_at,
        extract(epoch FROM k.expires_at)::bigint::text AS expires_at,
        coalesce(w.invited, false) AS invited
      `
      // Spent and reserved as `key_figures` has them: the captures not yet folded into the row counted (D315).
      const select = (where: Statement.Fragment) =>
        sql`SELECT ${columns} FROM api_keys k JOIN key_figures f ON f.key_id = k.key_id
            LEFT JOIN wallets w ON w.wallet = k.wallet WHERE ${where}`.pipe(
          Effect.flatMap(decodeRows),
          Effect.orDie
        )

      const setInvited = Effect.fn("Keys.setInvited")(function* (wallet: string, invited: boolean) {
        const owner = wallet.toLowerCase()
        yield* sql`
          INSERT INTO wallets (wallet, invited) VALUES (${owner}, ${invited})
          ON CONFLICT (wallet) DO UPDATE SET invited = EXCLUDED.invited, updated_at = now()
        `.pipe(Effect.orDie)
        return { wallet: owner, invited }
      })

      const isInvited = (wallet: string) =>
        sql<{ invited: boolean }>`SELECT invited FROM wallets WHERE wallet = ${wallet.toLowerCase()}`.pipe(
          Effect.map((rows) => rows[0]?.invited === true),
          Effect.orDie
        )

      const create = Effect.fn("Keys.create")(function* (wallet: string, input: CreateKeyInput) {
        const owner = wallet.toLowerCase()
        const kind: KeyKind = input.spend ? "credit" : "api"
        if (kind === "credit" && !(yield* isInvited(owner))) return yield* notInvited()
        const keyId = `key_${randomBytes(12).toString("hex")}`
        const secret = `${kind === "credit" ? "svc_ck_" : "svc_ak_"}${randomBytes(32).toString("base64url")}`
        yield* sql`
          INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget, expires_at)
          VALUES (${keyId}, ${owner}, ${input.label}, ${kind}, ${hashSecret(secret)}, ${input.budget},
                  ${input.expiresAt === undefined ? null : new Date(input.expiresAt * 1000)})
        `.pipe(Effect.orDie)
        const [row] = yield* select(sql`k.key_id = ${keyId}`)
        return { record: toRecord(row!), secret }
      })

      const list = (wallet: string) =>
        Effect.map(select(sql`k.wallet = ${wallet.toLowerCase()} ORDER BY k.created_at, k.key_id`), (rows) =>
          rows.map(toRecord)
        )

      const revoke = Effect.fn("Keys.revoke")(function* (wallet: string, keyId: string) {
        yield* sql`
          UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
          WHERE key_id = ${keyId} AND wallet = ${wallet.toLowerCase()}
        `.pipe(Effect.orDie)
        const [row] = yield* select(sql`k.key_id = ${keyId} AND k.wallet = ${wallet.toLowerCase()}`)
        if (row === undefined) {
          return yield* new NotFound({
            code: "key_not_found",
            message: `No key ${keyId} owned by this wallet`
          })
        }
        return toRecord(row)
      })

      const live = (secret: string) =>
        Effect.map(
          select(sql`k.key_hash = ${hashSecret(secret)} AND k.revoked_at IS NULL`),
          (rows) => rows[0]
        )

      /** Expiry is read against the router clock (not the database's), so tests move it with TestClock. */
      const expired = (row: typeof KeyRow.Type) =>
        Effect.map(
          Clock.currentTimeMillis,
          (nowMs) => row.expires_at !== null && row.expires_at * 1000 <= nowMs
        )
      const resolveCreditKey = Effect.fnUntraced(function* (secret: string) {
        const row = yield* live(secret)
        if (row === undefined) return yield* creditKeyRefusal("unknown")
        if (yield* expired(row)) return yield* creditKeyRefusal("expired")
        if (row.kind !== "credit") return yield* creditKeyRefusal("cannot_spend")
        if (!row.invited) return yield* creditKeyRefusal("not_invited")
        return {
          keyId: row.key_id,
          wallet: row.wallet,
          budget: row.budget,
          spent: row.spent,
          reserved: row.reserved,
          label: row.label
        } satisfies CreditKey
      })

      const resolveApiKey = Effect.fnUntraced(function* (secret: string) {
        const row = yield* live(secret)
        if (row === undefined) {
          return yield* new Unauthorized({ code: "invalid_api_key", message: "Unknown or revoked key" })
        }
        if (yield* expired(row)) return yield* keyExpired("key_expired")
        return toRecord(row)
      }, traced("Keys.resolveApiKey"))

      return Keys.of({ setInvited, isInvited, create, list, revoke, resolveCreditKey, resolveApiKey })
    })
  )
}
