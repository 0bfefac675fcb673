import { createHash, randomBytes } from "node:crypto"
import { Clock, Config, Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { SessionTape } from "../domain/Analytics.ts"
import { charge } from "../domain/Billing.ts"
import { Conflict, NotFound, Unauthorized } from "../domain/Errors.ts"
import { ReceiptBody } from "../domain/Receipt.ts"
import { epochOf } from "../ledger/Epochs.ts"
import { Ledger } from "../ledger/Ledger.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { traced } from "../Telemetry.ts"

export const SessionRow = Schema.Struct({
  session_id: Schema.String,
  payer: Schema.String,
  funding_kind: Schema.Literals(["x402", "credit"]),
  funding_request_id: Schema.String,
  key_id: Schema.NullOr(Schema.String),
  budget: Schema.NumberFromString,
  spent: Schema.NumberFromString,
  provider_id: Schema.String,
  model_class: Schema.String,
  price_in: Schema.NumberFromString,
  price_out: Schema.NumberFromString,
  price_in_cached: Schema.NullOr(Schema.NumberFromString),
  expires_at: Schema.Number,
  status: Schema.Literals(["open", "closed", "dead"]),
  in_flight: Schema.NullOr(Schema.String),
  turns: Schema.Number,
  prefix_tokens: Schema.Number,
  refund_ref: Schema.NullOr(Schema.String)
})
export type SessionRow = typeof SessionRow.Type
const decodeRows = Schema.decodeUnknownEffect(Schema.Array(SessionRow))

const columns = `session_id, payer, funding_kind, funding_request_id, key_id, budget::text, spent::text, provider_id,
  model_class, price_in::text, price_out::text, price_in_cached::text,
  (extract(epoch from expires_at) * 1000)::float8 AS expires_at, status, in_flight, turns, prefix_tokens, refund_ref`

const TapeRow = Schema.Struct({
  request_id: Schema.String,
  status: Schema.String,
  body: Schema.NullOr(ReceiptBody),
  price_setter: Schema.NullOr(Schema.String)
})
const decodeTape = Schema.decodeUnknownEffect(Schema.Array(TapeRow))

export const hashSessionToken = (token: string) => createHash("sha256").update(token).digest("hex")

/** Why a turn could not take its session (each maps to the spec's answer in Funding). */
export type TurnRefusal =
  | { readonly _tag: "Unknown" }
  | { readonly _tag: "BadToken" }
  | { readonly _tag: "Busy" }
  | { readonly _tag: "Dead" }
  | { readonly _tag: "Closed" }
  | { readonly _tag: "Expired" }
  | { readonly _tag: "Exhausted"; readonly remaining: number }

export interface SessionSettings {
  /** The least an x402-funded session asks its opening call to authorize (base units). */
  readonly minBudget: number
  /** What a funded key reserves to open a session (base units), at least the opening worst case. */
  readonly keyBudget: number
  /** Session length when the winning quote states no `session_ttl_s`. */
  readonly defaultTtlSeconds: number
}

/**
 * Budget sessions. The first completion carrying `routing.session_id` opens one, funded by
 * that call's authorization or key reservation; later turns draw on the budget with the
 * session token and no new signature, at the tariff locked by the opening auction. One turn
 * at a time: taking a session is a conditional update, so a concurrent turn sees
 * `session_used` before anything is charged, on any instance.
 */
export class Sessions extends Context.Service<
  Sessions,
  {
    readonly settings: SessionSettings
    readonly find: (sessionId: string) => Effect.Effect<SessionRow | undefined>
    /** Opens a session held by its opening request; returns the token (once). */
    readonly open: (input: {
      readonly sessionId: string
      readonly payer: string
      readonly fundingKind: "x402" | "credit"
      readonly fundingRequestId: string
      readonly keyId: string | null
      readonly budget: number
      readonly providerId: string
      readonly modelClass: string
      readonly priceIn: number
      readonly priceOut: number
      readonly priceInCached: number | null
      readonly ttlSeconds: number
    }) => Effect.Effect<string, Conflict>
    /** Takes the session for one turn whose worst case is `worstCase`. */
    readonly takeTurn: (
      sessionId: string,
      token: string | undefined,
      requestId: string,
      worstCase: number
    ) => Effect.Effect<SessionRow, TurnRefusal>
    /** A turn (or the opening call) failed before anything was served: let the session go. */
    readonly abandonTurn: (sessionId: string, requestId: string) => Effect.Effect<void>
    /** The opening call served nothing: the session never existed. */
    readonly discard: (sessionId: string) => Effect.Effect<void>
    readonly authorize: (
      sessionId: string,
      token: string | undefined
    ) => Effect.Effect<SessionRow, NotFound | Unauthorized>
    readonly close: (
      sessionId: string,
      token: string | undefined
    ) => Effect.Effect<SessionRow, NotFound | Unauthorized | Conflict>
    /** Settles every expired session that nobody closed; returns how many. */
    readonly expireDue: Effect.Effect<number>
    /** Every turn of a session with what its cached prefix saved (`/v1/analytics/sessions/:id`). */
    readonly tape: (sessionId: string) => Effect.Effect<SessionTape, NotFound>
  }
>()("router/payment/Sessions") {
  static readonly layer = Layer.effect(
    Sessions,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const config = yield* RouterConfig
      const ledger = yield* Ledger
      const settings: SessionSettings = {
        minBudget: yield* Config.Int("SESSION_MIN_BUDGET").pipe(Config.withDefault(100_000)),
        keyBudget: yield* Config.Int("SESSION_KEY_BUDGET").pipe(Config.withDefault(1_000_000)),
        defaultTtlSeconds: yield* Config.Int("SESSION_TTL_SECONDS").pipe(Config.withDefault(900))
      }

      const find = (sessionId: string) =>
        sql.unsafe(`SELECT ${columns} FROM sessions WHERE session_id = $1`, [sessionId]).pipe(
          Effect.flatMap(decodeRows),
          Effect.map((rows) => rows[0]),
          Effect.orDie
        )

      const open = Effect.fnUntraced(function* (input: Parameters<Sessions["Service"]["open"]>[0]) {
        const token = `svc_st_${randomBytes(24).toString("base64url")}`
        const rows = yield* sql`
          INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, key_id, budget,
                                provider_id, model_class, price_in, price_out, price_in_cached, expires_at, status,
                                in_flight)
          VALUES (${input.sessionId}, ${hashSessionToken(token)}, ${input.payer}, ${input.fundingKind},
                  ${input.fundingRequestId}, ${input.keyId}, ${input.budget}, ${input.providerId}, ${input.modelClass},
                  ${input.priceIn}, ${input.priceOut}, ${input.priceInCached},
                  now() + make_interval(secs => ${input.ttlSeconds}), 'open', ${input.fundingRequestId})
          ON CONFLICT (session_id) DO NOTHING
          RETURNING session_id
        `.pipe(Effect.orDie)
        if (rows.length === 0) {
          return yield* new Conflict({
            code: "session_used",
            param: "routing.session_id",
            message: "This session id was opened by another request; rotate the session id"
          })
        }
        return token
      }, traced("Sessions.open"))

      const takeTurn = Effect.fnUntraced(function* (
        sessionId: string,
        token: string | undefined,
        requestId: string,
        worstCase: number
      ) {
        const taken = yield* sql
          .unsafe(
            `UPDATE sessions SET in_flight = $1
             WHERE session_id = $2 AND token_hash = $3 AND status = 'open' AND in_flight IS NULL
               AND expires_at > now() AND spent + $4 <= budget
             RETURNING ${columns}`,
            [requestId, sessionId, hashSessionToken(token ?? ""), worstCase]
          )
          .pipe(Effect.flatMap(decodeRows), Effect.orDie)
        if (taken[0] !== undefined) return taken[0]
        // Say precisely why, from the row as it is now.
        const row = yield* find(sessionId)
        const now = yield* Clock.currentTimeMillis
        const refusal: TurnRefusal =
          row === undefined
            ? { _tag: "Unknown" }
            : token === undefined || (yield* tokenMatches(sessionId, token)) === false
              ? { _tag: "BadToken" }
              : row.status === "dead"
                ? { _tag: "Dead" }
                : row.status === "closed"
                  ? { _tag: "Closed" }
                  : row.expires_at <= now
                    ? { _tag: "Expired" }
                    : row.in_flight !== null
                      ? { _tag: "Busy" }
                      : { _tag: "Exhausted", remaining: row.budget - row.spent }
        return yield* Effect.fail(refusal)
      }, traced("Sessions.takeTurn"))

      const tokenMatches = (sessionId: string, token: string) =>
        sql<{ ok: boolean }>`
          SELECT token_hash = ${hashSessionToken(token)} AS ok FROM sessions WHERE session_id = ${sessionId}
        `.pipe(
          Effect.map((rows) => rows[0]?.ok === true),
          Effect.orDie
        )

      const abandonTurn = (sessionId: string, requestId: string) =>
        sql`UPDATE sessions SET in_flight = NULL WHERE session_id = ${sessionId} AND in_flight = ${requestId}`.pipe(
          Effect.asVoid,
          Effect.orDie
        )

      const discard = (sessionId: string) =>
        sql`DELETE FROM sessions WHERE session_id = ${sessionId} AND turns = 0`.pipe(
          Effect.asVoid,
          Effect.orDie
        )

      const authorize = Effect.fnUntraced(function* (sessionId: string, token: string | undefined) {
        const row = yield* find(sessionId)
        if (row === undefined) {
          return yield* new NotFound({ code: "session_not_found", message: `No session ${sessionId}` })
        }
        if (token === undefined || !(yield* tokenMatches(sessionId, token))) {
          return yield* new Unauthorized({
            code: "invalid_session_token",
            message: "Missing or invalid x-session-token"
          })
        }
        return row
      }, traced("Sessions.authorize"))

      /** Closes an open, idle session and settles its remainder (ledger/SessionClose.ts). */
      const settleClose = (sessionId: string, onlyExpired: boolean) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          ledger.closeSession(sessionId, onlyExpired, epochOf(now, config.epochSeconds))
        )

      const close = Effect.fnUntraced(function* (sessionId: string, token: string | undefined) {
        yield* authorize(sessionId, token)
        const closed = yield* settleClose(sessionId, false)
        if (!closed) {
          const row = yield* find(sessionId)
          return yield* new Conflict({
            code: "session_used",
            message:
              row?.status === "open"
                ? "A turn is in flight on this session; close it when the turn ends"
                : `The session is already ${row?.status ?? "gone"}`
          })
        }
        return (yield* find(sessionId))!
      }, traced("Sessions.close"))

      /** Expired sessions nobody closed: settled as if closed (their budget never stays locked). */
      const expireDue = Effect.gen(function* () {
        // An opening whose instance died between recording the session and reserving its funding (its
        // `undo` never ran) left a session with no funding request, busy with it for ever: gone once
        // expired, as the undo would have done (D292; nothing was reserved, nothing to settle).
        yield* sql`
          DELETE FROM sessions s WHERE s.status = 'open' AND s.turns = 0 AND s.expires_at <= now()
            AND NOT EXISTS (SELECT 1 FROM requests q WHERE q.request_id = s.funding_request_id)
        `.pipe(Effect.orDie)
        const due = yield* sql<{ session_id: string }>`
          SELECT session_id FROM sessions WHERE status = 'open' AND in_flight IS NULL AND expires_at <= now() LIMIT 100
        `.pipe(Effect.orDie)
        let closed = 0
        for (const { session_id } of due) {
          if (yield* settleClose(session_id, true)) closed++
        }
        return closed
      }).pipe(Effect.withSpan("Sessions.expireDue"))

      const tape = Effect.fn("Sessions.tape")(function* (sessionId: string) {
        const session = yield* find(sessionId)
        if (session === undefined) {
          return yield* new NotFound({ code: "session_not_found", message: `No session ${sessionId}` })
        }
        const rows = yield* sql`
          SELECT r.request_id, r.status, rc.body, e.body ->> 'price_setter' AS price_setter
          FROM requests r
          LEFT JOIN receipts rc ON rc.request_id = r.request_id
          LEFT JOIN economics e ON e.request_id = r.request_id
          WHERE r.session_id = ${sessionId} ORDER BY r.created_at
        `.pipe(Effect.flatMap(decodeTape), Effect.orDie)
        const turns = rows.flatMap((row, i) => {
          const receipt = row.body
          if (receipt === null) return []
          const uncached = charge(
            { input: receipt.in_tokens, cachedInput: 0, output: receipt.out_tokens },
            { price_in: receipt.price_in, price_out: receipt.price_out }
          )
          return [
            {
              turn: i + 1,
              request_id: row.request_id,
              created_at: receipt.created_at,
              status: receipt.status,
              in_tokens: receipt.in_tokens,
              cached_tokens: receipt.cached_tokens,
              out_tokens: receipt.out_tokens,
              charged: receipt.charged,
              cache_discount: Math.max(0, uncached - receipt.charged),
              price_setter: row.price_setter
            }
          ]
        })
        return {
          session_id: session.session_id,
          model_class: session.model_class,
          turns,
          cache_discount_total: turns.reduce((n, t) => n + t.cache_discount, 0),
          charged_total: turns.reduce((n, t) => n + t.charged, 0)
        } satisfies SessionTape
      })

      return Sessions.of({
        tape,
        settings,
        find,
        open,
        takeTurn,
        abandonTurn,
        discard,
        authorize,
        close,
        expireDue
      })
    })
  )
}
