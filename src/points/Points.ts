import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { NotFound } from "../domain/Errors.ts"
import type { LeaderboardEntry, PointsAccount, ProviderPoints } from "../domain/Points.ts"
import { Providers } from "../market/Providers.ts"
import { earnOf, providerScore, reliabilityBps, tierOf } from "./Earn.ts"

const Num = Schema.NumberFromString

const WalletRow = Schema.Struct({
  settled_charged: Num,
  pending_charged: Num,
  rewards: Num,
  bounties: Num,
  forfeited: Num,
  locked: Num,
  open_challenges: Schema.Number,
  won: Schema.Number,
  lost: Schema.Number,
  ambiguous: Schema.Number,
  score: Num,
  above: Num,
  rewarded: Schema.Array(Schema.String)
})
const decodeWallet = Schema.decodeUnknownEffect(Schema.Array(WalletRow))

const LeaderRow = Schema.Struct({ wallet: Schema.String, score: Num, rank: Num })
const decodeLeaders = Schema.decodeUnknownEffect(Schema.Array(LeaderRow))

const ProviderRow = Schema.Struct({
  rows: Num,
  settled_charged: Num,
  pending_charged: Num,
  receipts: Num,
  receipts_ok: Num,
  slashed: Num,
  upheld: Num
})
const decodeProvider = Schema.decodeUnknownEffect(Schema.Array(ProviderRow))

const emptyWallet: typeof WalletRow.Type = {
  settled_charged: 0,
  pending_charged: 0,
  rewards: 0,
  bounties: 0,
  forfeited: 0,
  locked: 0,
  open_challenges: 0,
  won: 0,
  lost: 0,
  ambiguous: 0,
  score: 0,
  above: 0,
  rewarded: []
}

export type Verdict = "upheld" | "rejected" | "ambiguous"

/**
 * The points ledger (docs/decisions.md D61). Receipts move `points_wallets` and `points_providers`
 * through the `receipts_points` trigger (migration 0009) in the transaction that writes them; the
 * programs' records move them through the methods below, called inside the program's own
 * transaction. Every read is a primary-key or index range read: none aggregates history.
 */
export class Points extends Context.Service<
  Points,
  {
    readonly account: (wallet: string) => Effect.Effect<PointsAccount>
    readonly leaderboard: (limit: number) => Effect.Effect<ReadonlyArray<LeaderboardEntry>>
    readonly provider: (providerId: string) => Effect.Effect<ProviderPoints, NotFound>
    /** Locks `stake` when the wallet's available points cover it (the caller's transaction). */
    readonly lockStake: (wallet: string, stake: number) => Effect.Effect<boolean>
    /** Releases a stake under a verdict: returned, returned with a bounty, or burned. */
    readonly settleStake: (
      wallet: string,
      stake: number,
      verdict: Verdict,
      bounty: number
    ) => Effect.Effect<void>
    /** An upheld challenge's slash off the provider's score; `key` spreads it over the shards. */
    readonly slashProvider: (providerId: string, key: string, slash: number) => Effect.Effect<void>
    readonly addReward: (wallet: string, points: number) => Effect.Effect<void>
  }
>()("router/points/Points") {
  static readonly layer = Layer.effect(
    Points,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const providers = yield* Providers

      const account = Effect.fn("Points.account")(function* (wallet: string) {
        const id = wallet.toLowerCase()
        const rows = yield* sql`
          SELECT w.settled_charged::text, w.pending_charged::text, w.rewards::text, w.bounties::text,
                 w.forfeited::text, w.locked::text, w.open_challenges, w.won, w.lost, w.ambiguous,
                 w.score::text,
                 (SELECT count(*) FROM points_wallets x WHERE x.score > w.score)::text AS above,
                 ARRAY(SELECT reward FROM points_rewards r WHERE r.wallet = w.wallet) AS rewarded
          FROM points_wallets w WHERE w.wallet = ${id}
        `.pipe(Effect.flatMap(decodeWallet), Effect.orDie)
        const row = rows[0] ?? emptyWallet
        const { tier, next } = tierOf(row.score)
        return {
          object: "points_account" as const,
          wallet: id,
          unit: "points" as const,
          score: row.score,
          tier,
          next_tier: next,
          rank: row.score > 0 ? row.above + 1 : null,
          available: row.score - row.locked,
          earn: earnOf(row.settled_charged, row.pending_charged),
          rewards: {
            follow: row.rewarded.includes("follow"),
            demo_share: row.rewarded.includes("demo_share"),
            points: row.rewards
          },
          challenges: {
            open: row.open_challenges,
            won: row.won,
            lost: row.lost,
            ambiguous: row.ambiguous,
            locked_stake: row.locked,
            earned_bounties: row.bounties,
            forfeited_stakes: row.forfeited,
            net: row.bounties - row.forfeited
          }
        }
      })

      /** Standard competition ranking: within the top of the index, `rank()` is the global rank. */
      const leaderboard = Effect.fn("Points.leaderboard")(function* (limit: number) {
        const rows = yield* sql`
          SELECT wallet, top.score::text AS score, rank() OVER (ORDER BY top.score DESC)::text AS rank
          FROM (SELECT wallet, score FROM points_wallets WHERE score > 0
                ORDER BY score DESC, wallet LIMIT ${limit}) top
          ORDER BY top.score DESC, wallet
        `.pipe(Effect.flatMap(decodeLeaders), Effect.orDie)
        return rows.map((row) => ({
          rank: row.rank,
          wallet: row.wallet,
          score: row.score,
          tier: tierOf(row.score).tier
        }))
      })

      const provider = Effect.fn("Points.provider")(function* (providerId: string) {
        const [row] = yield* sql`
          SELECT count(*)::text AS rows, coalesce(sum(settled_charged), 0)::text AS settled_charged,
                 coalesce(sum(pending_charged), 0)::text AS pending_charged,
                 coalesce(sum(receipts), 0)::text AS receipts, coalesce(sum(receipts_ok), 0)::text AS receipts_ok,
                 coalesce(sum(slashed), 0)::text AS slashed, coalesce(sum(upheld), 0)::text AS upheld
          FROM points_providers WHERE provider_id = ${providerId}
        `.pipe(Effect.flatMap(decodeProvider), Effect.orDie)
        if ((row === undefined || row.rows === 0) && providers.get(providerId) === undefined) {
          return yield* new NotFound({ code: "provider_not_found", message: `No provider ${providerId}` })
        }
        const totals = row!
        return {
          object: "provider_points" as const,
          provider_id: providerId,
          unit: "points" as const,
          score: providerScore({
            settledCharged: totals.settled_charged,
            receipts: totals.receipts,
            receiptsOk: totals.receipts_ok,
            slashed: totals.slashed
          }),
          earn: earnOf(totals.settled_charged, totals.pending_charged),
          served: {
            receipts: totals.receipts,
            receipts_ok: totals.receipts_ok,
            reliability_bps: reliabilityBps(totals.receipts, totals.receipts_ok),
            settled_volume: totals.settled_charged
          },
          challenges: { upheld: totals.upheld, slashed: totals.slashed }
        }
      })

      const lockStake = Effect.fn("Points.lockStake")(function* (wallet: string, stake: number) {
        const rows = yield* sql`
          UPDATE points_wallets SET locked = locked + ${stake}, open_challenges = open_challenges + 1
          WHERE wallet = ${wallet.toLowerCase()} AND score - locked >= ${stake}
          RETURNING wallet
        `.pipe(Effect.orDie)
        return rows.length === 1
      })

      const settleStake = Effect.fn("Points.settleStake")(function* (
        wallet: string,
        stake: number,
        verdict: Verdict,
        bounty: number
      ) {
        const won = verdict === "upheld" ? 1 : 0
        const lost = verdict === "rejected" ? 1 : 0
        yield* sql`
          UPDATE points_wallets
          SET locked = locked - ${stake}, open_challenges = open_challenges - 1,
              won = won + ${won}, lost = lost + ${lost}, ambiguous = ambiguous + ${verdict === "ambiguous" ? 1 : 0},
              bounties = bounties + ${won * bounty}, forfeited = forfeited + ${lost * stake}
          WHERE wallet = ${wallet.toLowerCase()}
        `.pipe(Effect.orDie)
      })

      const slashProvider = Effect.fn("Points.slashProvider")(function* (
        providerId: string,
        key: string,
        slash: number
      ) {
        yield* sql`
          INSERT INTO points_providers (provider_id, shard, slashed, upheld)
          VALUES (${providerId}, hashtext(${key}) & 7, ${slash}, 1)
          ON CONFLICT (provider_id, shard) DO UPDATE
          SET slashed = points_providers.slashed + EXCLUDED.slashed, upheld = points_providers.upheld + 1
        `.pipe(Effect.orDie)
      })

      const addReward = Effect.fn("Points.addReward")(function* (wallet: string, points: number) {
        yield* sql`
          INSERT INTO points_wallets (wallet, rewards) VALUES (${wallet.toLowerCase()}, ${points})
          ON CONFLICT (wallet) DO UPDATE SET rewards = points_wallets.rewards + EXCLUDED.rewards
        `.pipe(Effect.orDie)
      })

      return Points.of({
        account,
        leaderboard,
        provider,
        lockStake,
        settleStake,
        slashProvider,
        addReward
      })
    })
  )
}
