import { randomBytes } from "node:crypto"
import { ConfigProvider, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import type { Hex } from "viem"
import { generatePrivateKey, type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { Instances } from "../../src/db/Instances.ts"
import { charge } from "../../src/domain/Billing.ts"
import type { ChallengeFiling } from "../../src/domain/Integrity.ts"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"
import { Challengers } from "../../src/integrity/Challengers.ts"
import { Challenges } from "../../src/integrity/Challenges.ts"
import { Claims } from "../../src/integrity/Claims.ts"
import { evidenceHash } from "../../src/integrity/Evidence.ts"
import { IntegrityConfig } from "../../src/integrity/IntegrityConfig.ts"
import { MODEL_CHALLENGE_PURPOSE, modelChallengeTypedData } from "../../src/integrity/ModelChallenge.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { ModelCatalog } from "../../src/market/ModelCatalog.ts"
import { Providers } from "../../src/market/Providers.ts"
import { QuoteBook } from "../../src/market/QuoteBook.ts"
import type { RewardKind } from "../../src/points/Earn.ts"
import { Points } from "../../src/points/Points.ts"
import { rewardIntentTypedData } from "../../src/points/RewardIntent.ts"
import { Rewards } from "../../src/points/Rewards.ts"
import { RouterConfig } from "../../src/RouterConfig.ts"
import { seededEconomics } from "../ledger/support.ts"
import { TestDatabase } from "../support/Database.ts"
import { fundedKey } from "../support/Keys.ts"
import { routerWithFleet } from "../support/Router.ts"

/** The router and fleet with the challenge program switched on by configuration. */
export const routerWithChallenges = () =>
  routerWithFleet().pipe(
    Layer.provide(
      ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ MODEL_INTEGRITY_CHALLENGES: "true" }), {
        asPrimary: true
      })
    )
  )

/** The ledger and the programs over a fresh database and chain, with no HTTP and no background payer. */
export const programsLayer = Layer.mergeAll(Challenges.layer, Rewards.layer).pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      Points.layer,
      Claims.layer,
      Challengers.layer,
      Layer.succeed(IntegrityConfig, IntegrityConfig.of({ challengesEnabled: true }))
    )
  ),
  Layer.provideMerge(Layer.mergeAll(Ledger.layer, QuoteBook.layer)),
  Layer.provideMerge(Layer.mergeAll(Providers.layer, ModelCatalog.layerDefault, Instances.layer)),
  Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)),
  Layer.provideMerge(RouterConfig.layerTest())
)

export type Outcome = "landed" | "pending" | "failed" | "released" | "partial"

export interface ReceiptSpec {
  readonly wallet: string
  readonly providerId: string
  readonly modelClass?: string
  /** Exactly what the receipt charges: output tokens at 1,000,000 base units per million. */
  readonly charged: number
  /** How it was paid and where its settlement stands. */
  readonly pay: "credit" | "x402"
  readonly outcome: Outcome
}

const TARIFF = { price_in: 0, price_out: 1_000_000 }

/**
 * A receipt written by the ledger's own functions, as a paid request would write it: a reservation
 * (a funded key, or an x402 authorization held for settlement), then the capture or release, then
 * the settlement's finalization for x402.
 */
export const ledgerReceipt = (spec: ReceiptSpec) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const requestId = `req_${randomBytes(12).toString("hex")}`
    const released = spec.outcome === "released"
    const tokens = { input: 12, cachedInput: 0, output: released ? 0 : spec.charged }
    const charged = charge(tokens, TARIFF)
    const authorized = Math.max(charged, 1)
    const record = {
      requestId,
      dialect: "chat",
      payer: spec.wallet,
      requestedModel: spec.modelClass ?? "chat-small",
      modelClass: spec.modelClass ?? "chat-small",
      providerId: spec.providerId,
      authorized,
      agent: {}
    }
    const key =
      spec.pay === "credit"
        ? yield* fundedKey({ budget: 10 ** 12, balance: 10 ** 12, wallet: spec.wallet })
        : undefined
    if (key === undefined) {
      yield* ledger.reserveX402(record, {
        nonce: `0x${randomBytes(32).toString("hex")}`,
        validAfter: 0n,
        validBefore: 9_999_999_999n,
        signature: `0x${"11".repeat(65)}`
      })
    } else {
      yield* ledger.reserveCredit(record, key.keyId)
    }
    const receipt: ReceiptBody = {
      request_id: requestId,
      wallet: spec.wallet.toLowerCase(),
      provider_id: spec.providerId,
      model_class: spec.modelClass ?? "chat-small",
      in_tokens: tokens.input,
      out_tokens: tokens.output,
      cached_tokens: 0,
      price_in: TARIFF.price_in,
      price_out: TARIFF.price_out,
      price_in_cached: null,
      charged,
      authorized,
      payment_ref: key === undefined ? "" : `credit:${key.keyId}`,
      refund_ref: null,
      ttft_ms: 120,
      status: released ? "released" : spec.outcome === "partial" ? "partial" : "ok",
      settlement: released ? "none" : key === undefined ? "pending" : "landed",
      epoch_id: 1,
      session_id: null,
      quotes_competing: 2,
      created_at: Date.now()
    }
    const source =
      key === undefined ? ({ _tag: "X402" } as const) : ({ _tag: "Credit", keyId: key.keyId } as const)
    const economics = seededEconomics(requestId)
    if (released) yield* ledger.release({ receipt, economics, source })
    else yield* ledger.capture({ receipt, economics, source })
    if (key === undefined && (spec.outcome === "landed" || spec.outcome === "partial")) {
      yield* ledger.finalizeReceipt(requestId, {
        payment_ref: `0x${randomBytes(32).toString("hex")}`,
        settlement: "landed"
      })
    }
    if (key === undefined && spec.outcome === "failed") {
      yield* ledger.finalizeReceipt(requestId, { settlement: "failed" })
    }
    return { requestId, charged }
  })

export const registerProvider = (providerId: string) =>
  Effect.gen(function* () {
    const providers = yield* Providers
    const account = privateKeyToAccount(generatePrivateKey())
    yield* providers.register({
      provider_id: providerId,
      signer: account.address,
      base_url: "http://127.0.0.1:9",
      dialect: "openai"
    })
    return account
  })

export const newWallet = () => privateKeyToAccount(generatePrivateKey())

const nonce = (): Hex => `0x${randomBytes(32).toString("hex")}`

/** A reward intent signed by the wallet, `issuedAt` seconds (default: now). */
export const signedReward = (account: PrivateKeyAccount, reward: RewardKind, issuedAt?: number) =>
  Effect.promise(async () => {
    const intent = {
      reward,
      wallet: account.address,
      nonce: nonce(),
      issuedAt: issuedAt ?? Math.floor(Date.now() / 1000)
    }
    const signature = await account.signTypedData(rewardIntentTypedData(intent))
    return { wallet: account.address, nonce: intent.nonce, issued_at: intent.issuedAt, signature }
  })

/** A ModelChallenge filing signed by the wallet over this receipt and evidence. */
export const signedFiling = (
  account: PrivateKeyAccount,
  receiptId: string,
  summary = "served a smaller model than claimed",
  details: ChallengeFiling["details"] = { probe: "identity", observed: "small" }
) =>
  Effect.promise(async (): Promise<ChallengeFiling> => {
    const hash = evidenceHash({ receipt_id: receiptId, summary, details })
    const signature = await account.signTypedData(
      modelChallengeTypedData({ wallet: account.address, receiptId, evidenceHash: hash })
    )
    return {
      wallet: account.address,
      receipt_id: receiptId,
      purpose: MODEL_CHALLENGE_PURPOSE,
      summary,
      details,
      evidence_hash: hash,
      signature
    }
  })

/** Every table the points read model is derived into, for before/after comparisons. */
export const pointsTables = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const wallets = yield* sql`SELECT * FROM points_wallets ORDER BY wallet`
  const providers = yield* sql`SELECT * FROM points_providers ORDER BY provider_id, shard`
  return { wallets, providers }
}).pipe(Effect.orDie)
