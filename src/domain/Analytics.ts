import { Schema } from "effect"

/**
 * Key- and session-scoped analytics (spec 1 "Auction observability", 4.2): what a funded key's
 * requests cleared at, and what a session's turns were charged. Reads only.
 */

const Tariff = Schema.Struct({ price_in: Schema.Number, price_out: Schema.Number })

/** One request of a key, as `/v1/auctions/latest` lists it. */
export const AuctionRecord = Schema.Struct({
  request_id: Schema.String,
  /** Unix milliseconds. */
  created_at: Schema.Number,
  requested_model: Schema.String,
  status: Schema.String,
  session_id: Schema.NullOr(Schema.String),
  agent: Schema.Record(Schema.String, Schema.String),
  model_class: Schema.NullOr(Schema.String),
  winner: Schema.NullOr(Schema.String),
  mechanism: Schema.NullOr(Schema.String),
  version: Schema.NullOr(Schema.String),
  price_setter: Schema.NullOr(Schema.String),
  clear: Schema.NullOr(Tariff),
  quotes_competing: Schema.NullOr(Schema.Number),
  charged: Schema.NullOr(Schema.Number),
  authorized: Schema.NullOr(Schema.Number)
})
export type AuctionRecord = typeof AuctionRecord.Type

/** `view=json`: the versioned records. */
export const AuctionsLatest = Schema.Struct({
  object: Schema.Literal("auctions.latest"),
  version: Schema.Literal("svc.auctions/1"),
  key_id: Schema.String,
  requests: Schema.Array(AuctionRecord)
})

/** `view=replay`: the mechanism and the anonymized ranked bids of each auction. */
export const AuctionsReplay = Schema.Struct({
  object: Schema.Literal("auctions.replay"),
  auctions: Schema.Array(
    Schema.Struct({
      request_id: Schema.String,
      mechanism: Schema.NullOr(Schema.String),
      version: Schema.NullOr(Schema.String),
      price_setter: Schema.NullOr(Schema.String),
      bids: Schema.Array(
        Schema.Struct({
          rank: Schema.Number,
          provider: Schema.String,
          price_in: Schema.Number,
          price_out: Schema.Number,
          outcome: Schema.Literals(["won", "lost"])
        })
      )
    })
  )
})

/** `view=tree`: sessions, then parent tasks by agent, then everything else. */
export const AuctionsTree = Schema.Struct({
  object: Schema.Literal("auctions.tree"),
  sessions: Schema.Array(Schema.Struct({ session_id: Schema.String, requests: Schema.Array(AuctionRecord) })),
  parent_tasks: Schema.Array(
    Schema.Struct({
      parent_task: Schema.String,
      agents: Schema.Array(
        Schema.Struct({
          agent_id: Schema.String,
          role: Schema.NullOr(Schema.String),
          requests: Schema.Array(AuctionRecord)
        })
      )
    })
  ),
  ungrouped: Schema.Array(AuctionRecord)
})

/** `GET /v1/auctions/latest` as JSON (`view=tape` is plain text, one line per auction). */
export const AuctionsView = Schema.Union([AuctionsLatest, AuctionsReplay, AuctionsTree])
export type AuctionsView = typeof AuctionsView.Type

/** `GET /v1/keys/bestex`: each fill against the market's token-weighted average cleared tariff. */
export const Bestex = Schema.Struct({
  object: Schema.Literal("keys.bestex"),
  key_id: Schema.String,
  window_ms: Schema.Number,
  unit: Schema.String,
  fills: Schema.Array(
    Schema.Struct({
      request_id: Schema.String,
      model_class: Schema.String,
      charged: Schema.Number,
      market_vwap: Tariff,
      at_market_vwap: Schema.Number,
      improvement: Schema.Number,
      second_score_premium: Schema.Number,
      price_setter: Schema.NullOr(Schema.String)
    })
  ),
  totals: Schema.Struct({
    charged: Schema.Number,
    at_market_vwap: Schema.Number,
    second_score_premium: Schema.Number
  })
})
export type Bestex = typeof Bestex.Type

export const SessionTurn = Schema.Struct({
  turn: Schema.Number,
  request_id: Schema.String,
  created_at: Schema.Number,
  status: Schema.String,
  in_tokens: Schema.Number,
  cached_tokens: Schema.Number,
  out_tokens: Schema.Number,
  charged: Schema.Number,
  /** What the same tokens would have cost with no cached prefix, minus what was charged. */
  cache_discount: Schema.Number,
  price_setter: Schema.NullOr(Schema.String)
})

/** `GET /v1/analytics/sessions/:id`: every turn of a session and what its cached prefix saved. */
export const SessionTape = Schema.Struct({
  session_id: Schema.String,
  model_class: Schema.String,
  turns: Schema.Array(SessionTurn),
  cache_discount_total: Schema.Number,
  charged_total: Schema.Number
})
export type SessionTape = typeof SessionTape.Type
