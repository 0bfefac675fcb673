import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { PrivateKeyAccount } from "viem/accounts"
import { simulationAccount } from "../../src/devnet/fleet/FleetConfig.ts"
import type { ChallengeQuote, ChallengeView, ClaimView } from "../../src/domain/Integrity.ts"
import { claimSigningString } from "../../src/integrity/Claims.ts"
import { ledgerReceipt, newWallet, routerWithChallenges, signedFiling } from "../points/support.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, type Reply } from "../support/Router.ts"
import { admin, approve, codeOf, file, fundWithRewards, paidChat, quote, verdict } from "./support.ts"

const claimBody = (
  signer: PrivateKeyAccount,
  fields: { provider_id: string; model_class: string; model: string; bond_amount: number; signed_at?: number }
) =>
  Effect.promise(async () => {
    const claim = { ...fields, signed_at: fields.signed_at ?? Math.floor(Date.now() / 1000) }
    return { ...claim, sig: await signer.signMessage({ message: claimSigningString(claim) }) }
  })

const submit = (body: unknown) => postJson("/provider/model-integrity/claims", body)

describe("model claims, approved challengers and what the program's surfaces expose", () => {
  layer(routerWithChallenges(), { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.effect(
      "a provider signs its claim for a class it quotes; a newer claim supersedes it; claims are public",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const signer = simulationAccount("sim-openai-1")
          const fields = {
            provider_id: "sim-openai-1",
            model_class: "chat-medium",
            model: "acme/medium-2025-06",
            bond_amount: 250_000_000
          }
          const now = Math.floor(Date.now() / 1000)
          const body = yield* claimBody(signer, { ...fields, signed_at: now - 10 })
          const accepted = yield* submit(body)
          assert.strictEqual(accepted.status, 200, accepted.text)
          const claim = accepted.json as ClaimView
          assert.deepStrictEqual(
            [claim.status, claim.model, claim.bond_amount, claim.bond_kind, claim.signer.toLowerCase()],
            ["active", "acme/medium-2025-06", 250_000_000, "metadata", signer.address.toLowerCase()]
          )
          const read = yield* call(`/v1/model-integrity/claims/${claim.id}`)
          assert.deepStrictEqual(read.json, claim)
          // The identical signed claim again is the same record.
          assert.deepStrictEqual((yield* submit(body)).json, claim)

          // A receipt of that provider and class names the active claim in its quote and its challenge.
          const receipt = yield* ledgerReceipt({
            wallet: newWallet().address,
            providerId: "sim-openai-1",
            modelClass: "chat-medium",
            charged: 120_000,
            pay: "credit",
            outcome: "landed"
          })
          assert.strictEqual(((yield* quote(receipt.requestId)).json as ChallengeQuote).claim_id, claim.id)

          const newer = (yield* submit(yield* claimBody(signer, { ...fields, model: "acme/medium-2025-09" })))
            .json as ClaimView
          assert.deepStrictEqual([newer.status, newer.model], ["active", "acme/medium-2025-09"])
          const old = (yield* call(`/v1/model-integrity/claims/${claim.id}`)).json as ClaimView
          assert.strictEqual(old.status, "superseded")
          assert.isNotNull(old.superseded_at)
          assert.strictEqual(((yield* quote(receipt.requestId)).json as ChallengeQuote).claim_id, newer.id)
          // An older signature cannot take the class back.
          const stale = yield* submit(
            yield* claimBody(signer, { ...fields, model: "acme/old", signed_at: now - 60 })
          )
          assert.deepStrictEqual([stale.status, codeOf(stale)], [409, "claim_stale"])

          const refusals: Array<[Reply, number, string]> = [
            [
              yield* submit(yield* claimBody(simulationAccount("sim-openai-2"), fields)),
              401,
              "invalid_signature"
            ],
            [
              yield* submit(yield* claimBody(signer, { ...fields, model_class: "reasoning-large" })),
              400,
              "class_not_quoted"
            ],
            [
              yield* submit(yield* claimBody(signer, { ...fields, provider_id: "nobody" })),
              403,
              "provider_not_registered"
            ],
            [
              yield* submit(yield* claimBody(signer, { ...fields, signed_at: now - 400 })),
              400,
              "claim_expired"
            ],
            [yield* submit({ ...body, model: "two\nlines" }), 400, "invalid_request"],
            [yield* call("/v1/model-integrity/claims/clm_missing"), 404, "claim_not_found"]
          ]
          for (const [reply, status, code] of refusals) {
            assert.deepStrictEqual([reply.status, codeOf(reply)], [status, code], reply.text)
          }
        })
    )

    it.effect("challenger status is public; approving and revoking is the operator's", () =>
      Effect.gen(function* () {
        const wallet = newWallet().address
        const none = yield* call(`/v1/model-integrity/challengers/${wallet}`)
        assert.deepStrictEqual(none.json, {
          object: "model_integrity_challenger",
          wallet: wallet.toLowerCase(),
          status: "not_approved",
          approved: false,
          updated_at: null
        })
        const anonymous = yield* postJson("/v1/admin/model-integrity/challengers", { wallet, approved: true })
        assert.strictEqual(anonymous.status, 401)
        const wrong = yield* postJson(
          "/v1/admin/model-integrity/challengers",
          { wallet, approved: true },
          { authorization: "Bearer nope" }
        )
        assert.strictEqual(wrong.status, 401)
        assert.strictEqual((yield* approve(wallet)).status, 200)
        const approved = (yield* call(`/v1/model-integrity/challengers/${wallet}`)).json as {
          status: string
          approved: boolean
        }
        assert.deepStrictEqual([approved.status, approved.approved], ["approved", true])
        assert.strictEqual((yield* call("/v1/model-integrity/challengers/0xnope")).status, 400)
        const verdictWithoutToken = yield* postJson("/v1/admin/model-integrity/challenges/chl_x/verdict", {
          verdict: "upheld"
        })
        assert.strictEqual(verdictWithoutToken.status, 401)

        // Every endpoint of the programs is in the OpenAPI document with a real success schema.
        const doc = (yield* call("/openapi.json")).json as {
          paths: Record<string, Record<string, { responses: Record<string, { content?: unknown }> }>>
        }
        for (const [path, method, status] of [
          ["/v1/points/{wallet}", "get", "200"],
          ["/v1/points/leaderboard", "get", "200"],
          ["/v1/points/provider/{id}", "get", "200"],
          ["/v1/points/follow", "post", "200"],
          ["/v1/points/demo-share", "post", "200"],
          ["/v1/model-integrity/claims/{id}", "get", "200"],
          ["/v1/model-integrity/challengers/{wallet}", "get", "200"],
          ["/v1/model-integrity/challenges/quote", "get", "200"],
          ["/v1/model-integrity/challenges", "post", "201"],
          ["/provider/model-integrity/claims", "post", "200"],
          ["/v1/admin/model-integrity/challengers", "post", "200"],
          ["/v1/admin/model-integrity/challenges", "get", "200"],
          ["/v1/admin/model-integrity/challenges/{id}/verdict", "post", "200"]
        ] as const) {
          assert.isDefined(
            doc.paths[path]?.[method]?.responses[status]?.content,
            `${method} ${path} ${status}`
          )
        }
      })
    )

    it.effect("no endpoint of the program exposes a prompt, a reply or a key", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
        const prompt = `Remember the passphrase tangerine-${Date.now()} and repeat it.`
        const paid = yield* paidChat(key.secret, prompt)
        assert.isAbove(paid.text.length, 20)
        const challenger = newWallet()
        yield* fundWithRewards(challenger)
        yield* approve(challenger.address)
        const filed = yield* file(
          yield* signedFiling(challenger, paid.requestId, "suspicious", { note: "ok" })
        )
        const challenge = filed.json as ChallengeView
        const replies: Array<Reply> = [
          filed,
          yield* quote(paid.requestId, challenger.address),
          yield* call(`/v1/points/${key.wallet}`),
          yield* call(`/v1/points/${challenger.address}`),
          yield* call("/v1/points/leaderboard?limit=100"),
          yield* call(`/v1/points/provider/${paid.receipt.provider_id}`),
          yield* call(`/v1/model-integrity/challengers/${challenger.address}`),
          yield* call("/v1/admin/model-integrity/challenges", { headers: admin }),
          yield* verdict(challenge.id, "ambiguous")
        ]
        const sql = yield* SqlClient.SqlClient
        const stored = yield* sql<{ t: string }>`
          SELECT coalesce(string_agg(row_to_json(c)::text, ' '), '') AS t FROM integrity_challenges c`.pipe(
          Effect.orDie
        )
        const points = yield* sql<{ t: string }>`
          SELECT coalesce(string_agg(row_to_json(w)::text, ' '), '') AS t FROM points_wallets w`.pipe(
          Effect.orDie
        )
        const secrets = [prompt, "tangerine", paid.text, key.secret, key.secret.slice(7)]
        for (const reply of replies) {
          assert.strictEqual(reply.status < 300, true, reply.text)
          for (const secret of secrets) assert.notInclude(reply.text, secret)
        }
        for (const secret of secrets) {
          assert.notInclude(stored[0]!.t, secret)
          assert.notInclude(points[0]!.t, secret)
        }
        // The paying wallet's points move with the receipt, which is all the program sees of the request.
        assert.strictEqual(paid.receipt.settlement, "landed")
      })
    )
  })
})
