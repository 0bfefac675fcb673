import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { AdminChallengeView, ChallengeQuote, ChallengeView } from "../../src/domain/Integrity.ts"
import type { ProviderPoints } from "../../src/domain/Points.ts"
import { MODEL_CHALLENGE_PURPOSE } from "../../src/integrity/ModelChallenge.ts"
import { ledgerReceipt, newWallet, routerWithChallenges, signedFiling } from "../points/support.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call } from "../support/Router.ts"
import {
  account,
  admin,
  approve,
  codeOf,
  file,
  fundWithRewards,
  paidChat,
  quote,
  verdict
} from "./support.ts"

const providerPoints = (id: string) =>
  Effect.map(call(`/v1/points/provider/${id}`), (r) => r.json as ProviderPoints)

const challengeRows = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  return (yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM integrity_challenges`)[0]!.n
}).pipe(Effect.orDie)

/** A receipt charged exactly `charged` base units, written by the ledger for a fleet provider. */
const receiptCharged = (charged: number, outcome: "landed" | "released" = "landed") =>
  Effect.map(
    ledgerReceipt({
      wallet: newWallet().address,
      providerId: "sim-openai-1",
      modelClass: "chat-medium",
      charged,
      pay: "credit",
      outcome
    }),
    (r) => r.requestId
  )

describe("model-integrity challenges (spec 3.2) with the program switched on", () => {
  layer(routerWithChallenges(), { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.effect("the stake at its boundary: max(25 points, 1x the receipt's base earn)", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
        const paid = yield* paidChat(key.secret, "What is two plus two?")
        const real = (yield* quote(paid.requestId)).json as ChallengeQuote
        assert.isBelow(real.base_earn, 25, "a real chat receipt earns below 25 points")
        assert.deepStrictEqual([real.charged, real.stake], [paid.receipt.charged, 25])
        for (const [charged, base, stake] of [
          [249_999, 24, 25],
          [250_000, 25, 25],
          [260_000, 26, 26],
          [400_000, 40, 40]
        ] as const) {
          const q = (yield* quote(yield* receiptCharged(charged))).json as ChallengeQuote
          assert.deepStrictEqual(
            [q.charged, q.base_earn, q.minimum_stake, q.stake],
            [charged, base, 25, stake]
          )
          assert.deepStrictEqual(q.signing, {
            domain: { name: "svc Model Integrity", version: "1" },
            primary_type: "ModelChallenge",
            purpose: MODEL_CHALLENGE_PURPOSE
          })
        }
        assert.strictEqual(codeOf(yield* quote("req_missing")), "receipt_not_found")
        assert.strictEqual((yield* call("/v1/model-integrity/challenges/quote")).status, 400)
      })
    )

    it.effect(
      "none → open (stake locks) → rejected (burns) | ambiguous (returns) | upheld (half the slash)",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const alice = newWallet()
          const bob = newWallet()
          for (const w of [alice, bob]) {
            yield* fundWithRewards(w)
            assert.strictEqual((yield* approve(w.address)).status, 200)
          }
          const small = yield* receiptCharged(30_000) // base earn 3: stake 25
          const large = yield* receiptCharged(400_000) // base earn 40: stake 40

          // none → open: the stake locks.
          const first = yield* signedFiling(alice, small, "first look")
          const opened = yield* file(first)
          assert.strictEqual(opened.status, 201, opened.text)
          const c1 = opened.json as ChallengeView
          assert.deepStrictEqual([c1.status, c1.stake, c1.receipt_id, c1.slash], ["open", 25, small, null])
          let a = yield* account(alice.address)
          assert.deepStrictEqual(
            [a.score, a.available, a.challenges.open, a.challenges.locked_stake],
            [350, 325, 1, 25]
          )
          const held = (yield* quote(small)).json as ChallengeQuote
          assert.deepStrictEqual([held.open_to_challenge, held.live_challenge], [false, c1.id])

          // An open challenge blocks every other filing on the receipt.
          const blocked = yield* file(yield* signedFiling(bob, small, "me too"))
          assert.deepStrictEqual([blocked.status, codeOf(blocked)], [409, "receipt_already_challenged"])

          // open → rejected: the stake burns; the receipt can be challenged again.
          const rejected = yield* verdict(c1.id, "rejected", "replies match the claimed model")
          assert.strictEqual(rejected.status, 200, rejected.text)
          assert.deepStrictEqual((rejected.json as AdminChallengeView).status, "rejected")
          a = yield* account(alice.address)
          assert.deepStrictEqual(
            [
              a.score,
              a.available,
              a.challenges.lost,
              a.challenges.forfeited_stakes,
              a.challenges.locked_stake
            ],
            [325, 325, 1, 25, 0]
          )
          assert.isTrue(((yield* quote(small)).json as ChallengeQuote).open_to_challenge)
          // The same signed filing cannot open a second challenge.
          const replayed = yield* file(first)
          assert.deepStrictEqual([replayed.status, codeOf(replayed)], [409, "challenge_replayed"])

          // open → ambiguous: the stake returns; the receipt can be challenged again.
          const c2 = (yield* file(yield* signedFiling(alice, small, "second look"))).json as ChallengeView
          assert.strictEqual(c2.status, "open")
          assert.strictEqual((yield* account(alice.address)).available, 300)
          yield* verdict(c2.id, "ambiguous")
          a = yield* account(alice.address)
          assert.deepStrictEqual(
            [a.score, a.available, a.challenges.ambiguous, a.challenges.open],
            [325, 325, 1, 0]
          )
          assert.isTrue(((yield* quote(small)).json as ChallengeQuote).open_to_challenge)

          // open → upheld: the challenger is paid half the slash; the receipt stays blocked.
          const before = yield* providerPoints("sim-openai-1")
          const c3 = (yield* file(yield* signedFiling(alice, large, "served a smaller model")))
            .json as ChallengeView
          assert.deepStrictEqual([c3.status, c3.stake], ["open", 40])
          const upheld = (yield* verdict(c3.id, "upheld")).json as AdminChallengeView
          assert.deepStrictEqual([upheld.status, upheld.slash, upheld.bounty], ["upheld", 40, 20])
          a = yield* account(alice.address)
          assert.deepStrictEqual(
            [a.score, a.available, a.challenges.won, a.challenges.earned_bounties, a.challenges.net],
            [345, 345, 1, 20, -5]
          )
          const after = yield* providerPoints("sim-openai-1")
          assert.deepStrictEqual(
            [
              after.challenges.upheld - before.challenges.upheld,
              after.challenges.slashed - before.challenges.slashed
            ],
            [1, 40]
          )
          assert.strictEqual(after.score, before.score - 40)
          const stillBlocked = yield* file(yield* signedFiling(bob, large, "again"))
          assert.deepStrictEqual(
            [stillBlocked.status, codeOf(stillBlocked)],
            [409, "receipt_already_challenged"]
          )
          assert.deepStrictEqual(((yield* quote(large)).json as ChallengeQuote).live_challenge, c3.id)

          // A verdict is recorded once.
          assert.strictEqual(codeOf(yield* verdict(c3.id, "rejected")), "challenge_not_open")
          assert.strictEqual(codeOf(yield* verdict("chl_missing", "rejected")), "challenge_not_found")
          // Bob's refused filings moved nothing.
          const b = yield* account(bob.address)
          assert.deepStrictEqual([b.score, b.available, b.challenges.open], [350, 350, 0])

          // The operator reads the evidence; the public filing answer carries none.
          const listed = yield* call("/v1/admin/model-integrity/challenges?status=upheld", { headers: admin })
          const found = (listed.json as { data: Array<AdminChallengeView> }).data.find((c) => c.id === c3.id)!
          assert.deepStrictEqual(found.evidence, {
            receipt_id: large,
            summary: "served a smaller model",
            details: { probe: "identity", observed: "small" }
          })
          assert.notProperty(c3, "evidence")
          assert.strictEqual((yield* call("/v1/admin/model-integrity/challenges")).status, 401)
        })
    )

    it.effect("every refusal has its own code and locks nothing", () =>
      Effect.gen(function* () {
        const carol = newWallet()
        yield* fundWithRewards(carol)
        const receipt = yield* receiptCharged(50_000)
        const rows = yield* challengeRows
        const refused = (reply: { status: number }, status: number, code: string) => {
          assert.strictEqual(reply.status, status, code)
          assert.strictEqual(codeOf(reply as never), code)
        }
        refused(yield* file(yield* signedFiling(carol, receipt)), 403, "challenger_not_approved")
        yield* approve(carol.address)
        yield* approve(carol.address, false)
        const status = yield* call(`/v1/model-integrity/challengers/${carol.address}`)
        assert.deepStrictEqual(
          [(status.json as { status: string }).status, (status.json as { approved: boolean }).approved],
          ["revoked", false]
        )
        refused(yield* file(yield* signedFiling(carol, receipt)), 403, "challenger_not_approved")
        yield* approve(carol.address)

        const good = yield* signedFiling(carol, receipt)
        const other = yield* signedFiling(newWallet(), receipt)
        refused(yield* file({ ...good, signature: other.signature }), 401, "invalid_challenge_signature")
        refused(yield* file({ ...good, summary: "edited after signing" }), 400, "evidence_hash_mismatch")
        refused(yield* file({ ...good, purpose: "something else" }), 400, "invalid_purpose")
        refused(yield* file(yield* signedFiling(carol, "req_unknown")), 404, "receipt_not_found")
        refused(
          yield* file(yield* signedFiling(carol, receipt, "x", "y".repeat(17_000))),
          400,
          "evidence_too_large"
        )
        const released = yield* receiptCharged(0, "released")
        refused(yield* file(yield* signedFiling(carol, released)), 400, "receipt_not_served")
        refused(yield* file({ ...good, wallet: "0x123" }), 400, "invalid_request")

        const dave = newWallet()
        yield* approve(dave.address)
        refused(yield* file(yield* signedFiling(dave, receipt)), 403, "insufficient_points")
        assert.strictEqual(yield* challengeRows, rows)
        const d = yield* account(dave.address)
        assert.deepStrictEqual([d.available, d.challenges.locked_stake], [0, 0])
        // And the filing that satisfies every condition opens.
        assert.strictEqual((yield* file(good)).status, 201)
      })
    )

    it.effect(
      "concurrent filings: exactly one opens per receipt, and stakes never exceed available points",
      () =>
        Effect.gen(function* () {
          const wallets = Array.from({ length: 4 }, newWallet)
          for (const w of wallets) {
            yield* fundWithRewards(w)
            yield* approve(w.address)
          }
          const receipt = yield* receiptCharged(400_000)
          const filings = yield* Effect.forEach(wallets, (w) => signedFiling(w, receipt))
          const replies = yield* Effect.forEach(filings, file, { concurrency: "unbounded" })
          assert.deepStrictEqual(
            replies.map((r) => r.status).sort(),
            [201, 409, 409, 409],
            replies.map((r) => r.text).join("\n")
          )
          assert.isTrue(
            replies.filter((r) => r.status === 409).every((r) => codeOf(r) === "receipt_already_challenged")
          )
          const locked = yield* Effect.forEach(wallets, (w) =>
            Effect.map(account(w.address), (a) => a.challenges.locked_stake)
          )
          assert.deepStrictEqual(locked.sort(), [0, 0, 0, 40])

          // One wallet with 100 points files on three receipts staking 40 each at once: two fit.
          const erin = newWallet()
          yield* fundWithRewards(erin, "follow")
          yield* approve(erin.address)
          const three = yield* Effect.forEach([1, 2, 3], () => receiptCharged(400_000))
          const erinFilings = yield* Effect.forEach(three, (r) => signedFiling(erin, r))
          const erinReplies = yield* Effect.forEach(erinFilings, file, { concurrency: "unbounded" })
          assert.deepStrictEqual(erinReplies.map((r) => r.status).sort(), [201, 201, 403])
          const e = yield* account(erin.address)
          assert.deepStrictEqual(
            [e.score, e.available, e.challenges.locked_stake, e.challenges.open],
            [100, 20, 80, 2]
          )
        })
    )
  })
})
