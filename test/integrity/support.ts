import { Effect } from "effect"
import type { PrivateKeyAccount } from "viem/accounts"
import type { ChallengeFiling } from "../../src/domain/Integrity.ts"
import type { PointsAccount } from "../../src/domain/Points.ts"
import { signedReward } from "../points/support.ts"
import { receiptWhen } from "../support/Pay.ts"
import { call, OPERATOR_TOKEN, postJson, type Reply } from "../support/Router.ts"

export interface ErrorBody {
  readonly error: { readonly code: string; readonly param: string | null; readonly message: string }
}
export const codeOf = (reply: Reply) => (reply.json as ErrorBody | undefined)?.error?.code

export const admin = { authorization: `Bearer ${OPERATOR_TOKEN}` }

export const approve = (wallet: string, approved = true) =>
  postJson("/v1/admin/model-integrity/challengers", { wallet, approved }, admin)

export const account = (wallet: string) =>
  Effect.map(call(`/v1/points/${wallet}`), (r) => r.json as PointsAccount)

/** Both one-time rewards: 350 settled points to stake with. */
export const fundWithRewards = (wallet: PrivateKeyAccount, which: "follow" | "both" = "both") =>
  Effect.gen(function* () {
    yield* postJson("/v1/points/follow", yield* signedReward(wallet, "follow"))
    if (which === "both") yield* postJson("/v1/points/demo-share", yield* signedReward(wallet, "demo_share"))
  })

export const quote = (receiptId: string, wallet?: string) =>
  call(
    `/v1/model-integrity/challenges/quote?receipt_id=${receiptId}${wallet === undefined ? "" : `&wallet=${wallet}`}`
  )

export const file = (filing: ChallengeFiling) => postJson("/v1/model-integrity/challenges", filing)

export const verdict = (id: string, value: "upheld" | "rejected" | "ambiguous", note?: string) =>
  postJson(
    `/v1/admin/model-integrity/challenges/${id}/verdict`,
    { verdict: value, ...(note === undefined ? {} : { note }) },
    admin
  )

/** One paid chat completion with a funded key, as any client would send it. */
export const paidChat = (secret: string, content: string) =>
  Effect.gen(function* () {
    const reply = yield* postJson(
      "/v1/chat/completions",
      { model: "chat-small", messages: [{ role: "user", content }], max_tokens: 24 },
      { "x-credit-key": secret }
    )
    if (reply.status !== 200) return yield* Effect.die(new Error(`paid chat: ${reply.status} ${reply.text}`))
    const body = reply.json as { choices: Array<{ message: { content: string } }> }
    const requestId = reply.headers.get("x-request-id")!
    const receipt = yield* receiptWhen(requestId, (r) => r.final)
    return { requestId, text: body.choices[0]!.message.content, receipt: receipt.receipt }
  })
