import { assert, describe, layer } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as fc from "fast-check"
import { Challengers } from "../../src/integrity/Challengers.ts"
import { Challenges } from "../../src/integrity/Challenges.ts"
import { Points, type Verdict } from "../../src/points/Points.ts"
import { Rewards } from "../../src/points/Rewards.ts"
import { readRecords, rebuild, rebuiltScore } from "./rebuild.ts"
import {
  ledgerReceipt,
  newWallet,
  type Outcome,
  programsLayer,
  registerProvider,
  signedFiling,
  signedReward
} from "./support.ts"

const PROVIDERS = ["prov-a", "prov-b", "prov-c"]
const WALLETS = 5
/** Wallets 0..2 are approved challengers; 3 and 4 are not. */
const APPROVED = 3

const operation = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant("receipt" as const),
      wallet: fc.nat(WALLETS - 1),
      provider: fc.nat(PROVIDERS.length - 1),
      charged: fc.oneof(
        fc.integer({ min: 1, max: 9_999 }),
        fc.integer({ min: 10_000, max: 3_000_000 }),
        fc.constantFrom(249_999, 250_000, 260_000)
      ),
      pay: fc.constantFrom("credit" as const, "x402" as const),
      outcome: fc.constantFrom<Outcome>("landed", "pending", "failed", "released", "partial")
    })
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("reward" as const),
      wallet: fc.nat(WALLETS - 1),
      reward: fc.constantFrom("follow" as const, "demo_share" as const)
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("file" as const),
      wallet: fc.nat(WALLETS - 1),
      receipt: fc.nat(200)
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("verdict" as const),
      challenge: fc.nat(200),
      verdict: fc.constantFrom<Verdict>("upheld", "rejected", "ambiguous")
    })
  }
)
const histories = fc.array(operation, { minLength: 20, maxLength: 35 })

/** The read model against the rebuild, for every wallet and provider the records name, and the board. */
const compare = Effect.gen(function* () {
  const points = yield* Points
  const { wallets, providers } = rebuild(yield* readRecords)
  const scores = [...wallets.entries()].map(([wallet, w]) => ({ wallet, score: rebuiltScore(w) }))
  for (const [wallet, w] of wallets) {
    const account = yield* points.account(wallet)
    const score = rebuiltScore(w)
    const settled = Math.floor(w.settledCharged / 10_000)
    assert.deepStrictEqual(
      {
        score: account.score,
        earn: account.earn,
        rewards: account.rewards.points,
        available: account.available,
        rank: account.rank,
        challenges: account.challenges
      },
      {
        score,
        earn: { settled, pending: Math.floor((w.settledCharged + w.pendingCharged) / 10_000) - settled },
        rewards: w.rewards,
        available: score - w.locked,
        rank: score > 0 ? 1 + scores.filter((s) => s.score > score).length : null,
        challenges: {
          open: w.open,
          won: w.won,
          lost: w.lost,
          ambiguous: w.ambiguous,
          locked_stake: w.locked,
          earned_bounties: w.bounties,
          forfeited_stakes: w.forfeited,
          net: w.bounties - w.forfeited
        }
      },
      wallet
    )
  }
  for (const [providerId, p] of providers) {
    const view = yield* points.provider(providerId)
    const volume = Math.floor(p.settledCharged / 10_000)
    assert.deepStrictEqual(
      { score: view.score, served: view.served, challenges: view.challenges },
      {
        score: (p.receipts === 0 ? 0 : Math.floor((volume * p.receiptsOk) / p.receipts)) - p.slashed,
        served: {
          receipts: p.receipts,
          receipts_ok: p.receiptsOk,
          reliability_bps: p.receipts === 0 ? null : Math.floor((p.receiptsOk * 10_000) / p.receipts),
          settled_volume: p.settledCharged
        },
        challenges: { upheld: p.upheld, slashed: p.slashed }
      },
      providerId
    )
  }
  const board = yield* points.leaderboard(100)
  const expected = scores
    .filter((s) => s.score > 0)
    .sort((a, b) => b.score - a.score || (a.wallet < b.wallet ? -1 : 1))
  assert.deepStrictEqual(
    board.map((e) => [e.wallet, e.score, e.rank]),
    expected.map((s) => [s.wallet, s.score, 1 + expected.filter((o) => o.score > s.score).length])
  )
  return wallets.size
})

describe("points are derived: rebuilt from receipts, challenges and rewards alone they equal the read model", () => {
  layer(programsLayer, { timeout: 300_000 })((it) => {
    it.effect(
      "random histories of paid receipts (settled, pending, failed, released), rewards, filings and verdicts",
      () =>
        Effect.gen(function* () {
          const challengers = yield* Challengers
          const challenges = yield* Challenges
          const rewards = yield* Rewards
          for (const id of PROVIDERS) yield* registerProvider(id)
          const wallets = Array.from({ length: WALLETS }, newWallet)
          for (const w of wallets.slice(0, APPROVED)) yield* challengers.set(w.address, true)
          const receipts: Array<string> = []
          const filed: Array<string> = []
          let refused = 0
          for (const history of fc.sample(histories, { numRuns: 4, seed: 15 })) {
            for (const op of history) {
              switch (op.kind) {
                case "receipt": {
                  const { requestId } = yield* ledgerReceipt({
                    wallet: wallets[op.wallet]!.address,
                    providerId: PROVIDERS[op.provider]!,
                    charged: op.charged,
                    pay: op.pay,
                    outcome: op.outcome
                  })
                  receipts.push(requestId)
                  break
                }
                case "reward": {
                  const claim = yield* signedReward(wallets[op.wallet]!, op.reward)
                  const exit = yield* Effect.exit(rewards.claim(op.reward, claim))
                  if (Exit.isFailure(exit)) refused += 1
                  break
                }
                case "file": {
                  if (receipts.length === 0) break
                  const receipt = receipts[op.receipt % receipts.length]!
                  const filing = yield* signedFiling(wallets[op.wallet]!, receipt, `case ${filed.length}`)
                  const exit = yield* Effect.exit(challenges.file(filing))
                  if (Exit.isSuccess(exit)) filed.push(exit.value.id)
                  else refused += 1
                  break
                }
                case "verdict": {
                  if (filed.length === 0) break
                  const id = filed[op.challenge % filed.length]!
                  const exit = yield* Effect.exit(challenges.verdict(id, op.verdict, undefined))
                  if (Exit.isFailure(exit)) refused += 1
                }
              }
            }
            yield* compare
          }
          // The histories reached the interesting states, not only the trivial ones.
          const decided = yield* challenges.list(undefined, 200)
          assert.isAbove(receipts.length, 40)
          assert.isAbove(filed.length, 3, `filings opened (${refused} refusals)`)
          assert.isTrue(decided.some((c) => c.status !== "open"))
        })
    )
  })
})
