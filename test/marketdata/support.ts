import { randomBytes } from "node:crypto"
import { Effect } from "effect"
import { chargeNumerator, feeSplit } from "../../src/domain/Billing.ts"
import type { Economics } from "../../src/domain/Economics.ts"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { fundedKey } from "../support/Keys.ts"

export interface ClearSpec {
  readonly at: number
  readonly modelClass: string
  readonly providerId: string
  readonly tokens: { readonly input: number; readonly output: number }
  readonly tariff: { readonly price_in: number; readonly price_out: number }
  readonly ttftMs: number
  /** A released request delivered nothing and clears nothing. */
  readonly released?: boolean
}

/**
 * A paid request reserved on a funded key (`key`, or one of its own) by the ledger, and the record its capture (or
 * release) writes: the receipt and economics as the paid path builds them.
 */
export const reservedClear = (spec: ClearSpec, key?: { readonly keyId: string; readonly wallet: string }) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const requestId = `req_${randomBytes(12).toString("hex")}`
    const tokens = {
      input: spec.tokens.input,
      cachedInput: 0,
      output: spec.released ? 0 : spec.tokens.output
    }
    const charged = spec.released ? 0 : Math.ceil(Number(chargeNumerator(tokens, spec.tariff)) / 1_000_000)
    const authorized = Math.max(charged, 1)
    const payer = key ?? (yield* fundedKey({ budget: 10 ** 12, balance: 10 ** 12 }))
    yield* ledger.reserveCredit(
      {
        requestId,
        dialect: "chat",
        payer: payer.wallet,
        requestedModel: spec.modelClass,
        modelClass: spec.modelClass,
        providerId: spec.providerId,
        authorized,
        agent: {}
      },
      payer.keyId
    )
    const receipt: ReceiptBody = {
      request_id: requestId,
      wallet: payer.wallet,
      provider_id: spec.providerId,
      model_class: spec.modelClass,
      in_tokens: tokens.input,
      out_tokens: tokens.output,
      cached_tokens: 0,
      price_in: spec.tariff.price_in,
      price_out: spec.tariff.price_out,
      price_in_cached: null,
      charged,
      authorized,
      payment_ref: `credit:${payer.keyId}`,
      refund_ref: null,
      ttft_ms: spec.ttftMs,
      status: spec.released ? "released" : "ok",
      settlement: spec.released ? "none" : "landed",
      epoch_id: 1,
      session_id: null,
      quotes_competing: 3,
      created_at: spec.at
    }
    const { routerFee, providerShare } = feeSplit(charged)
    const economics: Economics = {
      request_id: requestId,
      version: "second-score/1",
      mechanism: "second-score",
      profile: "balanced",
      unit: "base units",
      tokens: { input: tokens.input, cached_input: 0, output: tokens.output },
      winner: {
        provider: spec.providerId,
        model: spec.modelClass,
        own_ask: spec.tariff,
        own_ask_charge: charged
      },
      clear: spec.tariff,
      price_setter: "runner-up",
      charged,
      authorized,
      second_score_premium: 0,
      competitors: [],
      quotes_competing: 3,
      latency: { ttft_ms: spec.ttftMs },
      fee_split: { router_fee_bps: 700, router_fee: routerFee, provider_share: providerShare, total: charged }
    }
    const record = { receipt, economics, source: { _tag: "Credit", keyId: payer.keyId } as const }
    return { requestId, charged, wallet: payer.wallet, record }
  })

/**
 * A paid request's records written by the ledger's own capture (or release), as the paid path writes
 * them: a funded key's reservation, then the receipt and economics in one transaction.
 */
export const ledgerClear = (spec: ClearSpec) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const { requestId, charged, wallet, record } = yield* reservedClear(spec)
    if (spec.released) yield* ledger.release(record)
    else yield* ledger.capture(record)
    return { requestId, charged, wallet }
  })
