import { ExactEvmScheme } from "@x402/evm/exact/client"
import { wrapFetchWithPayment, x402Client } from "@x402/fetch"
import { Effect } from "effect"
import type { Hex } from "viem"
import { type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { randomAuthorizationNonce, signTransferAuthorization } from "../../src/chain/Eip3009.ts"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import { defaultFleet } from "../../src/devnet/fleet/FleetConfig.ts"
import { decodeX402Header, paymentSignatureHeader } from "../../src/domain/X402.ts"
import { call, RouterUrl } from "./Router.ts"

/** What the router answers when the quote moved between its 402 and the signed retry (spec 5.2). */
const REPRICED = "signed amount below the quoted maximum"

const repriced = (response: Response): boolean => {
  const header = response.headers.get("payment-required")
  if (response.status !== 402 || header === null) return false
  try {
    return (decodeX402Header(header) as { error?: unknown }).error === REPRICED
  } catch {
    return false
  }
}

/**
 * The official `@x402/fetch` wrapper, used as an application uses it. The wrapper signs the quote of the
 * first 402 and retries once. Against the live fleet the quote can move in between (the fleet refreshes
 * its quotes, the auction's latency scores move with every request served): the router then refuses the
 * signature, before any inference and with no money moved, with a second 402 carrying the new quote, and
 * the wrapper hands that 402 back (it never retries twice). An application calls again, and the client
 * signs the new quote; so does this, up to `calls` calls. Any other 402 goes back to the test as it came.
 */
export const officialPayingFetch = (client: x402Client, calls = 3) => {
  const paying = wrapFetchWithPayment(fetch, client)
  return async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init)
    for (let call = 1; ; call++) {
      const response = await paying(request.clone())
      if (call >= calls || !repriced(response)) return response
      await response.body?.cancel()
    }
  }
}

/** An official x402 client paying from `account` on the local chain (its token allowed, 10 USDC a call). */
export const exactClient = (
  chain: { readonly network: `${string}:${string}`; readonly token: string },
  account: PrivateKeyAccount
) =>
  new x402Client().register(chain.network, new ExactEvmScheme(account)).setSpendControls({
    allowedAssets: [{ network: chain.network, asset: chain.token, maxAmountPerPayment: "10000000" }]
  })

/** A demo wallet of the local chain and an official x402 client paying from it. */
export const payer = (index = 0) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const account = privateKeyToAccount(chain.demoWallets[index]!.privateKey!)
    return { chain, account, payingFetch: officialPayingFetch(exactClient(chain, account)) }
  })

/**
 * A hand-built x402 v2 envelope for negative tests (the official client only signs what it is asked).
 * `signer` signs in `account`'s name (a forgery); `sentValue` is what the envelope claims after the
 * signing (a tampered amount).
 */
export const handSignedHeader = (
  account: PrivateKeyAccount,
  options: {
    value: bigint
    scheme?: string
    to?: Hex
    validBefore?: bigint
    signer?: PrivateKeyAccount
    sentValue?: bigint
  }
) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const nowS = BigInt(Math.floor(Date.now() / 1000))
    const authorization = {
      from: account.address,
      to: options.to ?? chain.treasury,
      value: options.value,
      validAfter: 0n,
      validBefore: options.validBefore ?? nowS + 300n,
      nonce: randomAuthorizationNonce()
    }
    const signature = yield* Effect.promise(() =>
      signTransferAuthorization(options.signer ?? account, {
        token: chain.token,
        chainId: chain.chainId,
        domain: chain.tokenDomain,
        ...authorization
      })
    )
    return paymentSignatureHeader({
      x402Version: 2,
      scheme: options.scheme ?? "exact",
      network: chain.network,
      payload: { authorization: { ...authorization, value: options.sentValue ?? options.value }, signature }
    })
  })

/** Total requests the simulated providers have seen (to prove "no provider work"). */
export const providerRequests = Effect.gen(function* () {
  const fleet = yield* Fleet
  let total = 0
  for (const provider of fleet.providers) {
    const counters = yield* provider.counters
    total += Object.values(counters.requests).reduce((a, b) => a + b, 0)
  }
  return total
})

export const waitFor = <A, R>(
  what: string,
  probe: Effect.Effect<A | undefined, never, R>,
  timeoutMs = 30_000
) =>
  Effect.gen(function* () {
    const started = Date.now()
    while (Date.now() - started < timeoutMs) {
      const value = yield* probe
      if (value !== undefined) return value
      yield* Effect.sleep("100 millis")
    }
    return yield* Effect.die(new Error(`timed out waiting for ${what}`))
  })

/** How many quotes each class has once every provider of the default fleet has published. */
const fleetDepth = new Map<string, number>()
for (const provider of defaultFleet) {
  for (const offer of provider.offers) {
    fleetDepth.set(offer.modelClass, (fleetDepth.get(offer.modelClass) ?? 0) + 1)
  }
}

/**
 * Waits until every provider of the default fleet has its quotes in the book. The fleet publishes provider
 * by provider: a test that names a provider, reads depth or needs a runner-up must not start on a book
 * where only some have arrived (one quote per class is not enough).
 */
export const waitForBook = waitFor(
  "every provider's quotes",
  Effect.map(call("/v1/market/book"), (r) => {
    const classes = (r.json as { classes: Array<{ model_class: string; depth: number }> }).classes
    const full = [...fleetDepth].every(([id, depth]) =>
      classes.some((c) => c.model_class === id && c.depth >= depth)
    )
    return full ? true : undefined
  })
)

/** Waits until the book holds at least one quote for `modelClass`. */
export const waitForQuote = (modelClass: string) =>
  waitFor(
    "the provider's quote",
    Effect.map(call("/v1/market/book"), (r) => {
      const classes = (r.json as { classes: Array<{ model_class?: string; id?: string; depth: number }> })
        .classes
      return classes.some((c) => (c.model_class ?? c.id) === modelClass && c.depth >= 1) ? true : undefined
    })
  )

export interface ReceiptView {
  readonly receipt: {
    readonly status: string
    readonly settlement: string
    readonly charged: number
    readonly authorized: number
    readonly provider_id: string
    readonly out_tokens: number
    readonly refund_ref: string | null
    readonly payment_ref: string
  }
  readonly final: boolean
}

export const receiptWhen = (id: string, predicate: (r: ReceiptView) => boolean = () => true) =>
  waitFor(
    `receipt ${id}`,
    Effect.map(call(`/v1/receipts/${id}`), (r) =>
      r.status === 200 && predicate(r.json as ReceiptView) ? (r.json as ReceiptView) : undefined
    )
  )

/** Reads an SSE body until it ends or `stopAfter` data frames were seen. */
export const readSse = (response: Response, stopAfter = Number.POSITIVE_INFINITY) =>
  Effect.promise(async () => {
    const reader = response.body!.getReader()
    const decoder = new TextDecoder()
    let text = ""
    let frames = 0
    while (frames < stopAfter) {
      const { done, value } = await reader.read()
      if (done) break
      text += decoder.decode(value, { stream: true })
      frames = (text.match(/^data: /gm) ?? []).length
    }
    return { text, reader }
  })

export const routerBase = RouterUrl

/** A transfer authorization from `account` to the treasury, valid for an hour, signed as a payer would. */
export const signedTransfer = (account: PrivateKeyAccount, value: bigint) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const authorization = {
      from: account.address,
      to: chain.treasury,
      value,
      validAfter: 0n,
      validBefore: BigInt(Math.floor(Date.now() / 1000) + 3600),
      nonce: randomAuthorizationNonce()
    }
    const signature = yield* Effect.promise(() =>
      signTransferAuthorization(account, {
        token: chain.token,
        chainId: chain.chainId,
        domain: chain.tokenDomain,
        ...authorization
      })
    )
    return { authorization, signature }
  })
