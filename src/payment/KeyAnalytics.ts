import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { AuctionRecord, type AuctionsView, type Bestex } from "../domain/Analytics.ts"
import { charge } from "../domain/Billing.ts"
import { Economics, EconomicsRecord } from "../domain/Economics.ts"
import type { Forbidden } from "../domain/Errors.ts"
import { Unauthorized } from "../domain/Errors.ts"
import { ReceiptBody } from "../domain/Receipt.ts"
import { Keys } from "./Keys.ts"

const { request_id, created_at, requested_model, status, session_id, agent } = AuctionRecord.fields

/** A key's request as stored: its own fields, its receipt and its economics. */
const Row = Schema.Struct({
  request_id,
  created_at,
  requested_model,
  status,
  session_id,
  agent,
  receipt: Schema.NullOr(ReceiptBody),
  economics: Schema.NullOr(EconomicsRecord)
})
type Row = Omit<typeof Row.Type, "economics"> & { readonly economics: Economics | null }
const decodeRows = Schema.decodeUnknownEffect(Schema.Array(Row))

/** A reaped request's economics (nothing was auctioned for it to show) reads as none. */
const withAuction = (row: typeof Row.Type): Row => ({
  ...row,
  economics: row.economics !== null && Schema.is(Economics)(row.economics) ? row.economics : null
})

const record = (row: Row): AuctionRecord => ({
  request_id: row.request_id,
  created_at: row.created_at,
  requested_model: row.requested_model,
  status: row.status,
  session_id: row.session_id,
  agent: row.agent,
  model_class: row.receipt?.model_class ?? null,
  winner: row.economics?.winner.provider ?? null,
  mechanism: row.economics?.mechanism ?? null,
  version: row.economics?.version ?? null,
  price_setter: row.economics?.price_setter ?? null,
  clear: row.economics?.clear ?? null,
  quotes_competing: row.economics?.quotes_competing ?? null,
  charged: row.receipt?.charged ?? null,
  authorized: row.receipt?.authorized ?? null
})

const tapeLine = (row: Row) => {
  const r = record(row)
  return [
    new Date(r.created_at).toISOString(),
    r.request_id,
    r.model_class ?? "-",
    r.winner ?? "-",
    r.clear === null ? "clear=-" : `clear=${r.clear.price_in}/${r.clear.price_out}`,
    `setter=${r.price_setter ?? "-"}`,
    `quotes=${r.quotes_competing ?? "-"}`,
    `charged=${r.charged ?? "-"}`,
    r.status
  ].join(" ")
}

const replay = (row: Row) => ({
  request_id: row.request_id,
  mechanism: row.economics?.mechanism ?? null,
  version: row.economics?.version ?? null,
  price_setter: row.economics?.price_setter ?? null,
  bids:
    row.economics === null
      ? []
      : [
          {
            rank: 1,
            provider: row.economics.winner.provider,
            ...row.economics.clear,
            outcome: "won" as const
          },
          ...[...row.economics.competitors]
            .sort((a, b) => a.rank - b.rank)
            .map((c) => ({
              rank: c.rank,
              provider: c.label,
              price_in: c.price_in,
              price_out: c.price_out,
              outcome: "lost" as const
            }))
        ]
})

/** Sessions, then parent tasks (by agent), then everything else. */
const tree = (rows: ReadonlyArray<Row>) => {
  const sessions = new Map<string, Array<AuctionRecord>>()
  const tasks = new Map<string, Map<string, Array<AuctionRecord>>>()
  const loose: Array<AuctionRecord> = []
  for (const row of rows) {
    const r = record(row)
    if (row.session_id !== null) sessions.set(row.session_id, [...(sessions.get(row.session_id) ?? []), r])
    const parent = row.agent.parent_task
    if (parent !== undefined) {
      const agents = tasks.get(parent) ?? new Map()
      const agent = row.agent.agent_id ?? "(unnamed)"
      agents.set(agent, [...(agents.get(agent) ?? []), r])
      tasks.set(parent, agents)
    }
    if (row.session_id === null && parent === undefined) loose.push(r)
  }
  return {
    sessions: [...sessions].map(([session_id, requests]) => ({ session_id, requests })),
    parent_tasks: [...tasks].map(([parent_task, agents]) => ({
      parent_task,
      agents: [...agents].map(([agent_id, requests]) => ({
        agent_id,
        role: requests[0]?.agent.role ?? null,
        requests
      }))
    })),
    ungrouped: loose
  }
}

export type AuctionsReply =
  | { readonly _tag: "Tape"; readonly text: string }
  | { readonly _tag: "View"; readonly view: AuctionsView }

/**
 * Key-scoped reads of the book of record (spec 1, "Auction observability"): the latest auctions a
 * funded key paid for, in four views, and its fills against the market's average cleared tariff. They
 * make no model call and change nothing.
 */
export class KeyAnalytics extends Context.Service<
  KeyAnalytics,
  {
    readonly auctions: (
      creditKey: string | undefined,
      view: "tape" | "replay" | "tree" | "json",
      limit: number
    ) => Effect.Effect<AuctionsReply, Unauthorized | Forbidden>
    readonly bestex: (
      creditKey: string | undefined,
      windowMs: number
    ) => Effect.Effect<Bestex, Unauthorized | Forbidden>
  }
>()("router/payment/KeyAnalytics") {
  static readonly layer = Layer.effect(
    KeyAnalytics,
    Effect.gen(function* () {
      const keys = yield* Keys
      const sql = yield* SqlClient.SqlClient

      const resolve = (secret: string | undefined) =>
        secret === undefined
          ? Effect.fail(new Unauthorized({ code: "invalid_credit_key", message: "x-credit-key is required" }))
          : keys.resolveCreditKey(secret)

      const rowsFor = (keyId: string, limit: number) =>
        sql`
          SELECT r.request_id, (extract(epoch from r.created_at) * 1000)::float8 AS created_at, r.requested_model,
                 r.status, r.session_id, r.agent, rc.body AS receipt, e.body AS economics
          FROM requests r
          LEFT JOIN receipts rc ON rc.request_id = r.request_id
          LEFT JOIN economics e ON e.request_id = r.request_id
          WHERE r.key_id = ${keyId}
          ORDER BY r.created_at DESC LIMIT ${limit}
        `.pipe(
          Effect.flatMap(decodeRows),
          Effect.map((rows) => rows.map(withAuction)),
          Effect.orDie
        )

      const auctions = Effect.fn("KeyAnalytics.auctions")(function* (
        creditKey: string | undefined,
        view: "tape" | "replay" | "tree" | "json",
        limit: number
      ) {
        const key = yield* resolve(creditKey)
        const rows = yield* rowsFor(key.keyId, limit)
        switch (view) {
          case "tape":
            return {
              _tag: "Tape",
              text: rows.map(tapeLine).join("\n") + (rows.length > 0 ? "\n" : "")
            } as const
          case "replay":
            return { _tag: "View", view: { object: "auctions.replay", auctions: rows.map(replay) } } as const
          case "tree":
            return { _tag: "View", view: { object: "auctions.tree", ...tree(rows) } } as const
          case "json":
            return {
              _tag: "View",
              view: {
                object: "auctions.latest",
                version: "svc.auctions/1",
                key_id: key.keyId,
                requests: rows.map(record)
              }
            } as const
        }
      })

      const bestex = Effect.fn("KeyAnalytics.bestex")(function* (
        creditKey: string | undefined,
        windowMs: number
      ) {
        const key = yield* resolve(creditKey)
        // The market's token-weighted average cleared tariff per class over the window.
        const market = yield* sql<{ model_class: string; vwap_in: number | null; vwap_out: number | null }>`
          SELECT body ->> 'model_class' AS model_class,
                 sum((body ->> 'price_in')::numeric * (body ->> 'in_tokens')::numeric)
                   / nullif(sum((body ->> 'in_tokens')::numeric), 0) AS vwap_in,
                 sum((body ->> 'price_out')::numeric * (body ->> 'out_tokens')::numeric)
                   / nullif(sum((body ->> 'out_tokens')::numeric), 0) AS vwap_out
          FROM receipts
          WHERE created_at > now() - make_interval(secs => ${windowMs / 1000}) AND (body ->> 'charged')::bigint > 0
          GROUP BY 1
        `.pipe(Effect.orDie)
        const vwap = new Map(market.map((m) => [m.model_class, m]))
        const rows = yield* rowsFor(key.keyId, 200)
        const fills = rows.flatMap((row) => {
          const receipt = row.receipt
          if (receipt === null || receipt.charged === 0) return []
          const m = vwap.get(receipt.model_class)
          const tariff = {
            price_in: Math.round(Number(m?.vwap_in ?? receipt.price_in)),
            price_out: Math.round(Number(m?.vwap_out ?? receipt.price_out))
          }
          const tokens = { input: receipt.in_tokens, cachedInput: 0, output: receipt.out_tokens }
          const atMarket = charge(tokens, tariff)
          return [
            {
              request_id: row.request_id,
              model_class: receipt.model_class,
              charged: receipt.charged,
              market_vwap: tariff,
              at_market_vwap: atMarket,
              improvement: atMarket - receipt.charged,
              second_score_premium: row.economics?.second_score_premium ?? 0,
              price_setter: row.economics?.price_setter ?? null
            }
          ]
        })
        return {
          object: "keys.bestex",
          key_id: key.keyId,
          window_ms: windowMs,
          unit: "base units (6 decimals)",
          fills,
          totals: {
            charged: fills.reduce((n, f) => n + f.charged, 0),
            at_market_vwap: fills.reduce((n, f) => n + f.at_market_vwap, 0),
            second_score_premium: fills.reduce((n, f) => n + f.second_score_premium, 0)
          }
        } satisfies Bestex
      })

      return KeyAnalytics.of({ auctions, bestex })
    })
  )
}
