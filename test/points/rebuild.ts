import { Effect, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { ReceiptBody } from "../../src/domain/Receipt.ts"

/**
 * Points rebuilt from the records alone (receipts, challenges, rewards), written out here from the
 * spec's words so it does not share code with the read model it checks: 100 points per unit charged,
 * settled once the receipt's settlement landed and pending before; a challenge's stake locked while
 * open, burned when rejected, returned otherwise, with half the slash (= the stake) paid when upheld.
 */
export interface RebuiltWallet {
  settledCharged: number
  pendingCharged: number
  rewards: number
  bounties: number
  forfeited: number
  locked: number
  open: number
  won: number
  lost: number
  ambiguous: number
}

export interface RebuiltProvider {
  settledCharged: number
  pendingCharged: number
  receipts: number
  receiptsOk: number
  slashed: number
  upheld: number
}

const ChallengeRecord = Schema.Struct({
  wallet: Schema.String,
  provider_id: Schema.String,
  status: Schema.Literals(["open", "upheld", "rejected", "ambiguous"]),
  stake: Schema.NumberFromString,
  slash: Schema.NullOr(Schema.NumberFromString),
  bounty: Schema.NullOr(Schema.NumberFromString)
})
const RewardRecord = Schema.Struct({ wallet: Schema.String, points: Schema.NumberFromString })

export const readRecords = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const receipts = yield* Effect.flatMap(sql<{ body: unknown }>`SELECT body FROM receipts`, (rows) =>
    Schema.decodeUnknownEffect(Schema.Array(ReceiptBody))(rows.map((r) => r.body))
  )
  const challenges = yield* Effect.flatMap(
    sql`SELECT wallet, provider_id, status, stake::text, slash::text, bounty::text FROM integrity_challenges`,
    Schema.decodeUnknownEffect(Schema.Array(ChallengeRecord))
  )
  const rewards = yield* Effect.flatMap(
    sql`SELECT wallet, points::text FROM points_rewards`,
    Schema.decodeUnknownEffect(Schema.Array(RewardRecord))
  )
  return { receipts, challenges, rewards }
}).pipe(Effect.orDie)

export type Records = Effect.Success<typeof readRecords>

const zeroWallet = (): RebuiltWallet => ({
  settledCharged: 0,
  pendingCharged: 0,
  rewards: 0,
  bounties: 0,
  forfeited: 0,
  locked: 0,
  open: 0,
  won: 0,
  lost: 0,
  ambiguous: 0
})
const zeroProvider = (): RebuiltProvider => ({
  settledCharged: 0,
  pendingCharged: 0,
  receipts: 0,
  receiptsOk: 0,
  slashed: 0,
  upheld: 0
})

export const rebuild = (records: Records) => {
  const wallets = new Map<string, RebuiltWallet>()
  const providers = new Map<string, RebuiltProvider>()
  const wallet = (id: string) => {
    const key = id.toLowerCase()
    if (!wallets.has(key)) wallets.set(key, zeroWallet())
    return wallets.get(key)!
  }
  const provider = (id: string) => {
    if (!providers.has(id)) providers.set(id, zeroProvider())
    return providers.get(id)!
  }
  for (const r of records.receipts) {
    const p = provider(r.provider_id)
    p.receipts += 1
    if (r.status === "ok") p.receiptsOk += 1
    if (r.settlement === "landed") {
      wallet(r.wallet).settledCharged += r.charged
      p.settledCharged += r.charged
    }
    if (r.settlement === "pending") {
      wallet(r.wallet).pendingCharged += r.charged
      p.pendingCharged += r.charged
    }
  }
  for (const reward of records.rewards) wallet(reward.wallet).rewards += reward.points
  for (const c of records.challenges) {
    const w = wallet(c.wallet)
    switch (c.status) {
      case "open":
        w.open += 1
        w.locked += c.stake
        break
      case "upheld": {
        const slash = c.stake
        const bounty = Math.floor(slash / 2)
        if (c.slash !== slash || c.bounty !== bounty) throw new Error(`slash/bounty record disagrees: ${c}`)
        w.won += 1
        w.bounties += bounty
        provider(c.provider_id).slashed += slash
        provider(c.provider_id).upheld += 1
        break
      }
      case "rejected":
        w.lost += 1
        w.forfeited += c.stake
        break
      case "ambiguous":
        w.ambiguous += 1
    }
  }
  return { wallets, providers }
}

/** Score of a rebuilt wallet: whole points of the settled charge, plus rewards and bounties, less burns. */
export const rebuiltScore = (w: RebuiltWallet) =>
  Math.floor(w.settledCharged / 10_000) + w.rewards + w.bounties - w.forfeited
