/**
 * The soak's paid calls, each planned at random and told apart afterwards: x402 `exact` (the official
 * `@x402/fetch` client signs the quote of a 402, then the call is sent with the signature) or a funded
 * credit key; `/v1/chat/completions` or `/v1/messages`; streamed or not; a provider fault asked of the
 * simulated fleet (`[[sim:error]]`, `[[sim:drop]]`, `[[sim:slow]]` in the message); and a client that
 * hangs up at a random moment after sending. Every authorization a client signs is kept (payer, nonce,
 * value), whether or not the router ever saw it: the audit holds the chain and the ledger to each.
 */
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { x402Client, x402HTTPClient } from "@x402/fetch"
import type { PrivateKeyAccount } from "viem/accounts"
import type { FundedKey } from "../support/CreditKeys.ts"

export type Fault = "error" | "drop" | "slow"

export interface Plan {
  readonly id: number
  readonly pay: "x402" | "key"
  readonly api: "chat" | "messages"
  readonly stream: boolean
  readonly fault: Fault | undefined
  /** Hang up this long after the paid call is sent; undefined: read the answer to its end. */
  readonly hangUpAfterMs: number | undefined
}

export interface SignedAuthorization {
  readonly payer: string
  readonly nonce: string
  readonly value: bigint
}

export interface Outcome {
  readonly plan: Plan
  readonly instance: string
  /** The paid call's status; 0 when no status arrived (hang-up before it, or a cut connection). */
  readonly status: number
  /** The client hung up (by plan) before the answer ended. */
  readonly hungUp: boolean
  /** The connection broke without the client hanging up (a killed instance). */
  readonly cut: boolean
  /** A 200 whose body ended as its dialect ends (a stream's final event, a whole JSON reply). */
  readonly complete: boolean
  readonly requestId: string | undefined
  /** The error code of a non-2xx answer, when it had one. */
  readonly code: string | undefined
  readonly signed: ReadonlyArray<SignedAuthorization>
}

export const planRequest = (id: number, random: () => number): Plan => {
  const roll = random()
  return {
    id,
    pay: random() < 0.5 ? "x402" : "key",
    api: random() < 0.5 ? "chat" : "messages",
    stream: random() < 0.5,
    fault: roll < 0.04 ? "error" : roll < 0.08 ? "drop" : roll < 0.1 ? "slow" : undefined,
    hangUpAfterMs: random() < 0.12 ? Math.floor(random() * 600) : undefined
  }
}

const body = (plan: Plan) => {
  const marker = plan.fault === undefined ? "" : ` [[sim:${plan.fault}]]`
  const messages = [{ role: "user", content: `Soak call ${plan.id}: say something short.${marker}` }]
  return JSON.stringify({ model: "chat-small", max_tokens: 24, stream: plan.stream, messages })
}

const path = (plan: Plan) => (plan.api === "chat" ? "/v1/chat/completions" : "/v1/messages")

/** Whether a 200 body ended as its dialect ends a whole answer. */
const endedWhole = (plan: Plan, text: string) => {
  if (!plan.stream) {
    try {
      JSON.parse(text)
      return true
    } catch {
      return false
    }
  }
  return plan.api === "chat" ? text.includes("data: [DONE]") : text.includes("event: message_stop")
}

const codeOf = (text: string): string | undefined => {
  try {
    const json = JSON.parse(text) as { code?: unknown; error?: { code?: unknown; type?: unknown } }
    const code = json.code ?? json.error?.code ?? json.error?.type
    return typeof code === "string" ? code : undefined
  } catch {
    return undefined
  }
}

/** The x402 signers: one official client per demo wallet. */
export const x402Payers = (accounts: ReadonlyArray<PrivateKeyAccount>, network: `${string}:${string}`) =>
  accounts.map(
    (account) =>
      new x402HTTPClient(
        new x402Client().register(network, new ExactEvmScheme(account)).setSpendControls(false)
      )
  )

export interface Clients {
  readonly payers: ReadonlyArray<x402HTTPClient>
  readonly keys: ReadonlyArray<FundedKey>
}

const REPRICED = "signed amount below the quoted maximum"

/**
 * One paid call against `instance`. x402: the unpaid call's 402 is signed and the call sent again with
 * the signature (again, up to three times, when the quote moved in between, as an application does).
 */
export const send = async (plan: Plan, instance: string, clients: Clients): Promise<Outcome> => {
  const url = `${instance}${path(plan)}`
  const payload = body(plan)
  const signed: Array<SignedAuthorization> = []
  const base = { plan, instance, signed }
  const headers: Record<string, string> = { "content-type": "application/json" }
  if (plan.api === "messages") headers["anthropic-version"] = "2023-06-01"
  const failed = (status: number, text: string, cut: boolean): Outcome => ({
    ...base,
    status,
    hungUp: false,
    cut,
    complete: false,
    requestId: undefined,
    code: codeOf(text)
  })

  const paid: Array<Record<string, string>> = []
  if (plan.pay === "key") {
    paid.push({ "x-credit-key": clients.keys[plan.id % clients.keys.length]!.secret })
  }
  for (let attempt = 1; ; attempt++) {
    let extra: Record<string, string>
    if (plan.pay === "key") extra = paid[0]!
    else {
      const payer = clients.payers[plan.id % clients.payers.length]!
      const quote = await signQuote(url, headers, payload, payer, signed)
      if (quote._tag === "Refused") return failed(quote.status, quote.text, quote.status === 0)
      extra = quote.headers
    }
    const result = await call(plan, url, { ...headers, ...extra }, payload)
    if (
      plan.pay === "x402" &&
      attempt < 3 &&
      result.status === 402 &&
      (result.paymentRequired ?? "").includes(REPRICED)
    )
      continue
    return { ...base, ...result, code: result.status === 200 ? undefined : codeOf(result.text) }
  }
}

type Quote =
  | { readonly _tag: "Signed"; readonly headers: Record<string, string> }
  | { readonly _tag: "Refused"; readonly status: number; readonly text: string }

/**
 * The unpaid call's 402 signed by `payer` (the official client picks the `exact` requirement it can
 * pay); the authorization is added to `signed` before it is sent anywhere. Status 0: no answer.
 */
const signQuote = async (
  url: string,
  headers: Record<string, string>,
  payload: string,
  payer: x402HTTPClient,
  signed: Array<SignedAuthorization>
): Promise<Quote> => {
  let unpaid: Response
  try {
    unpaid = await fetch(url, { method: "POST", headers, body: payload })
  } catch (error) {
    return { _tag: "Refused", status: 0, text: String(error) }
  }
  const text = await unpaid.text().catch(() => "")
  if (unpaid.status !== 402) return { _tag: "Refused", status: unpaid.status, text }
  const required = payer.getPaymentRequiredResponse((name) => unpaid.headers.get(name))
  const payment = await payer.createPaymentPayload(required)
  const authorization = (payment.payload as { authorization?: Record<string, string> }).authorization
  if (authorization !== undefined) {
    signed.push({
      payer: authorization.from!.toLowerCase(),
      nonce: authorization.nonce!.toLowerCase(),
      value: BigInt(authorization.value!)
    })
  }
  return { _tag: "Signed", headers: payer.encodePaymentSignatureHeader(payment) }
}

/**
 * A credit deposit paid with x402 (`POST /v1/credits/deposits`), as a funded key's owner makes it: the
 * balance the keys spend is backed by tokens that reached the treasury.
 */
export const deposit = async (
  instance: string,
  payer: x402HTTPClient,
  amountUsdc: string,
  signed: Array<SignedAuthorization>
) => {
  const url = `${instance}/v1/credits/deposits`
  const headers = { "content-type": "application/json" }
  const payload = JSON.stringify({ amount_usdc: amountUsdc })
  const quote = await signQuote(url, headers, payload, payer, signed)
  if (quote._tag === "Refused")
    throw new Error(`deposit refused: ${quote.status} ${quote.text.slice(0, 300)}`)
  const response = await fetch(url, {
    method: "POST",
    headers: { ...headers, ...quote.headers },
    body: payload
  })
  const text = await response.text()
  if (response.status !== 202) throw new Error(`deposit: ${response.status} ${text.slice(0, 300)}`)
}

/** The paid call itself, hung up by plan; the answer read to its end otherwise. */
const call = async (plan: Plan, url: string, headers: Record<string, string>, payload: string) => {
  const abort = new AbortController()
  const timer =
    plan.hangUpAfterMs === undefined ? undefined : setTimeout(() => abort.abort(), plan.hangUpAfterMs)
  let status = 0
  let requestId: string | undefined
  let paymentRequired: string | undefined
  let text = ""
  try {
    const response = await fetch(url, { method: "POST", headers, body: payload, signal: abort.signal })
    status = response.status
    requestId = response.headers.get("x-request-id") ?? undefined
    const header = response.headers.get("payment-required")
    if (header !== null) paymentRequired = Buffer.from(header, "base64").toString("utf8")
    text = await response.text()
    const complete = status === 200 && endedWhole(plan, text)
    return { status, hungUp: false, cut: false, complete, requestId, text, paymentRequired }
  } catch (error) {
    const hungUp = abort.signal.aborted
    return {
      status,
      hungUp,
      cut: !hungUp,
      complete: false,
      requestId,
      text: hungUp ? "" : String(error),
      paymentRequired
    }
  } finally {
    if (timer !== undefined) clearTimeout(timer)
  }
}
