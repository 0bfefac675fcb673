/**
 * The soak's paid calls, each planned at random and told apart afterwards: x402 `exact` (the official
 * `@x402/fetch` client signs the quote of a 402, then the call is sent with the signature) or a funded
 * credit key; `/v1/chat/completions` or `/v1/messages`; streamed or not; a provider fault asked of the
 * simulated fleet (`[[sim:error]]`, `[[sim:drop]]`, `[[sim:slow]]` in the message); and a client that
 * hangs up at a random moment after sending. Some calls pay with x402 `upto` (the official Permit2 client),
 * some carry an `Idempotency-Key` and are sent again after a hang-up or twice at once, and some open a
 * budget session (`routing.session_id`) and take turns on it (`x-session-token`) before closing it. Every
 * call names its plan in `x-routing-agent-id` (the ledger keeps it), so the audit can count the charges
 * of one plan. Every authorization a client signs is kept (payer, nonce, value), whether or not the router
 * ever saw it: the audit holds the chain and the ledger to each.
 */
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { UptoEvmScheme } from "@x402/evm/upto/client"
import { x402Client, x402HTTPClient } from "@x402/fetch"
import type { PrivateKeyAccount } from "viem/accounts"
import { uptoNonceKey } from "../../src/ledger/Reserve.ts"
import type { FundedKey } from "../support/CreditKeys.ts"

export type Fault = "error" | "drop" | "slow"

export interface Plan {
  readonly id: number
  /** x402 `exact`, x402 `upto` (Permit2 ceiling, settled at the metered charge), or a funded key. */
  readonly pay: "x402" | "upto" | "key"
  readonly api: "chat" | "messages"
  readonly stream: boolean
  readonly fault: Fault | undefined
  /** Hang up this long after the paid call is sent; undefined: read the answer to its end. */
  readonly hangUpAfterMs: number | undefined
  /**
   * With an `Idempotency-Key`: sent again with the same key, payment and body after a hang-up, or twice
   * at once. Either way at most one charge.
   */
  readonly idempotency: "after-hang-up" | "alongside" | undefined
  /** A budget session: its turns after the opening call (0: not a session). */
  readonly turns: number
}

export interface SignedAuthorization {
  readonly scheme: "exact" | "upto"
  readonly payer: string
  /** The token's EIP-3009 nonce; for `upto`, Permit2's as the ledger keys it (`permit2:0x…`). */
  readonly nonce: string
  /** What the signature lets move: the value (`exact`) or the ceiling (`upto`). */
  readonly value: bigint
}

export interface Outcome {
  readonly plan: Plan
  /** Which call of its plan: the call, its idempotent repeat, a session's opening, turn or close. */
  readonly role: "call" | "repeat" | "opening" | "turn" | "close"
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
  const payRoll = random()
  const shape = random()
  const turns = shape >= 0.08 && shape < 0.11 ? 2 + Math.floor(random() * 3) : 0
  const pay = payRoll < 0.35 ? "x402" : payRoll < 0.5 ? "upto" : "key"
  return {
    id,
    // A session's budget takes `exact` only (README "Paying"); sessions are opened on chat completions.
    pay: turns > 0 && pay === "upto" ? "x402" : pay,
    api: turns > 0 || random() < 0.5 ? "chat" : "messages",
    stream: random() < 0.5,
    fault:
      turns > 0 ? undefined : roll < 0.04 ? "error" : roll < 0.08 ? "drop" : roll < 0.1 ? "slow" : undefined,
    hangUpAfterMs: random() < 0.12 || shape < 0.05 ? Math.floor(random() * 600) : undefined,
    idempotency: shape < 0.05 ? "after-hang-up" : shape < 0.08 ? "alongside" : undefined,
    turns
  }
}

const body = (plan: Plan, session?: { readonly id: string; readonly turn: number }) => {
  const marker = plan.fault === undefined ? "" : ` [[sim:${plan.fault}]]`
  const messages = [{ role: "user", content: `Soak call ${plan.id}: say something short.${marker}` }]
  for (let t = 1; t <= (session?.turn ?? 0); t++)
    messages.push({ role: "assistant", content: "Something short." }, { role: "user", content: `Turn ${t}.` })
  const routing = session === undefined ? {} : { routing: { session_id: session.id } }
  // Sessions need a quote with a session tariff: the fleet's chat-medium providers state one.
  const model = session === undefined ? "chat-small" : "chat-medium"
  return JSON.stringify({ model, max_tokens: 24, stream: plan.stream, messages, ...routing })
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

/** The x402 signers: one official client per demo wallet, `exact` only or (Permit2 approved) `upto` only. */
export const x402Payers = (
  accounts: ReadonlyArray<PrivateKeyAccount>,
  network: `${string}:${string}`,
  scheme: "exact" | "upto" = "exact"
) =>
  accounts.map(
    (account) =>
      new x402HTTPClient(
        new x402Client()
          .register(network, scheme === "exact" ? new ExactEvmScheme(account) : new UptoEvmScheme(account))
          .setSpendControls(false)
      )
  )

export interface Clients {
  readonly payers: ReadonlyArray<x402HTTPClient>
  readonly uptoPayers: ReadonlyArray<x402HTTPClient>
  readonly keys: ReadonlyArray<FundedKey>
}

const REPRICED = "signed amount below the quoted maximum"
const IN_PROGRESS = "still in progress"

/** Where a call goes: an instance that is up, picked afresh for every call of a plan. */
export type Target = () => string

/**
 * One plan's paid calls against the instances `target` picks. x402: the unpaid call's 402 is signed and
 * the call sent again with the signature (again, up to three times, when the quote moved in between, as
 * an application does). A session plan opens its session, takes its turns and closes it; an idempotent
 * plan sends its call a second time with the same key (see `Plan`).
 */
export const send = async (plan: Plan, target: Target, clients: Clients): Promise<ReadonlyArray<Outcome>> => {
  if (plan.turns > 0) return sendSession(plan, target, clients)
  const signed: Array<SignedAuthorization> = []
  const first = await paidCall(plan, "call", target(), clients, signed, plan.idempotency)
  if (plan.idempotency === undefined || first.extra === undefined) return [first.outcome]
  // The same key, payment and body again: after the hang-up, or at once beside the first call.
  const repeat = (instance: string) => {
    const url = `${instance}${path(plan)}`
    return repeatWhileInProgress(() =>
      call(plan, url, { ...first.headers, ...first.extra }, first.payload, undefined)
    ).then((result) => outcomeOf(plan, "repeat", instance, [], result))
  }
  if (first.beside !== undefined)
    return [first.outcome, outcomeOf(plan, "repeat", first.outcome.instance, [], first.beside)]
  return [first.outcome, await repeat(target())]
}

/** A repeat that meets the first call still running (409) waits a moment and asks again, as a client does. */
const repeatWhileInProgress = async (attempt: () => Promise<CallResult>) => {
  for (let n = 1; ; n++) {
    const result = await attempt()
    if (n >= 8 || result.status !== 409 || !result.text.includes(IN_PROGRESS)) return result
    await new Promise((done) => setTimeout(done, 250 * n))
  }
}

const outcomeOf = (
  plan: Plan,
  role: Outcome["role"],
  instance: string,
  signed: ReadonlyArray<SignedAuthorization>,
  result: CallResult
): Outcome => ({
  plan,
  role,
  instance,
  signed,
  status: result.status,
  hungUp: result.hungUp,
  cut: result.cut,
  complete: result.complete,
  requestId: result.requestId,
  code: result.status === 200 ? undefined : codeOf(result.text)
})

/**
 * One paid call of `plan` (its payment made as the plan says), re-signed when the quote moved. Returns
 * the headers it was sent with, so an idempotent plan can send the very same call again.
 */
const paidCall = async (
  plan: Plan,
  role: Outcome["role"],
  instance: string,
  clients: Clients,
  signed: Array<SignedAuthorization>,
  idempotency: Plan["idempotency"],
  session?: { readonly id: string; readonly turn: number }
) => {
  const url = `${instance}${path(plan)}`
  const payload = body(plan, session)
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "x-routing-agent-id": `soak-${plan.id}`
  }
  if (plan.api === "messages") headers["anthropic-version"] = "2023-06-01"
  if (idempotency !== undefined) headers["idempotency-key"] = `soak-idem-${plan.id}`
  // The first of an idempotent pair hangs up (after-hang-up) or reads its answer (alongside).
  const hangUp = idempotency === "alongside" ? undefined : plan.hangUpAfterMs
  for (let attempt = 1; ; attempt++) {
    let extra: Record<string, string>
    if (plan.pay === "key") extra = { "x-credit-key": clients.keys[plan.id % clients.keys.length]!.secret }
    else {
      const payers = plan.pay === "upto" ? clients.uptoPayers : clients.payers
      const quote = await signQuote(url, headers, payload, payers[plan.id % payers.length]!, signed)
      if (quote._tag === "Refused") {
        const result = {
          status: quote.status,
          hungUp: false,
          cut: quote.status === 0,
          complete: false,
          text: quote.text
        }
        const outcome = outcomeOf(plan, role, instance, signed, { ...result, requestId: undefined })
        return { outcome, headers, payload, extra: undefined, beside: undefined, token: undefined }
      }
      extra = quote.headers
    }
    const sent = { ...headers, ...extra }
    const [result, beside] = await Promise.all([
      call(plan, url, sent, payload, hangUp),
      idempotency === "alongside" ? repeatSoon(plan, url, sent, payload) : undefined
    ])
    const repriced = (r: CallResult | undefined) =>
      r?.status === 402 && (r.paymentRequired ?? "").includes(REPRICED)
    if (plan.pay !== "key" && attempt < 3 && repriced(result) && (beside === undefined || repriced(beside)))
      continue
    const outcome = outcomeOf(plan, role, instance, signed, result)
    return { outcome, headers, payload, extra, beside, token: result.sessionToken }
  }
}

/** Beside an `alongside` call: the same call a few milliseconds later (its outcome is the plan's repeat). */
const repeatSoon = async (plan: Plan, url: string, headers: Record<string, string>, payload: string) => {
  await new Promise((done) => setTimeout(done, plan.id % 20))
  return repeatWhileInProgress(() => call(plan, url, headers, payload, undefined))
}

/**
 * A budget session: opened by a paid call carrying `routing.session_id` (x402 `exact` or a key), then
 * `plan.turns` turns with `x-session-token` (one of them hung up when the plan hangs up; a turn that finds
 * the session still busy with the last one, 409 `session_used`, asks again), then closed.
 */
const sendSession = async (plan: Plan, target: Target, clients: Clients): Promise<ReadonlyArray<Outcome>> => {
  const id = `soak-session-${plan.id}`
  const signed: Array<SignedAuthorization> = []
  // The opening is read to its end: a client that hangs up on it never learns the session's token, and the
  // session waits for its expiry (the quote's `session_ttl_s`, minutes) before its budget comes back.
  const opening = { ...plan, hangUpAfterMs: undefined }
  const opened = await paidCall(opening, "opening", target(), clients, signed, undefined, { id, turn: 0 })
  const outcomes: Array<Outcome> = [opened.outcome]
  const token = opened.outcome.status === 200 ? opened.token : undefined
  if (token === undefined) return outcomes
  for (let turn = 1; turn <= plan.turns; turn++) {
    const instance = target()
    const url = `${instance}${path(plan)}`
    const headers = { ...opened.headers, "x-session-token": token }
    const hangUp = turn === 1 ? plan.hangUpAfterMs : undefined
    let result = await call(plan, url, headers, body(plan, { id, turn }), hangUp)
    for (let n = 1; n < 8 && result.status === 409 && result.text.includes("session_used"); n++) {
      await new Promise((done) => setTimeout(done, 250 * n))
      result = await call(plan, url, headers, body(plan, { id, turn }), hangUp)
    }
    outcomes.push(outcomeOf(plan, "turn", instance, [], result))
  }
  // Closed once idle (a hung-up turn may still be settling: 409 until it has; a turn whose settlement was
  // deferred by a database stall, or an instance restarting, takes longer): asked again for up to a minute.
  for (let n = 1; ; n++) {
    const instance = target()
    const closed = await fetch(`${instance}/v1/sessions/${id}/close`, {
      method: "POST",
      headers: { "x-session-token": token }
    }).then(
      async (r) => ({ status: r.status, text: await r.text() }),
      (error) => ({ status: 0, text: String(error) })
    )
    if (closed.status === 200 || n >= 60) {
      const result = {
        status: closed.status,
        hungUp: false,
        cut: closed.status === 0,
        complete: closed.status === 200,
        requestId: undefined,
        text: closed.text
      }
      outcomes.push(outcomeOf(plan, "close", instance, [], result))
      return outcomes
    }
    await new Promise((done) => setTimeout(done, 1_000))
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
  const { authorization, permit2Authorization: permit } = payment.payload as {
    authorization?: Record<string, string>
    permit2Authorization?: { from: string; nonce: string; permitted: { amount: string } }
  }
  if (authorization !== undefined) {
    signed.push({
      scheme: "exact",
      payer: authorization.from!.toLowerCase(),
      nonce: authorization.nonce!.toLowerCase(),
      value: BigInt(authorization.value!)
    })
  }
  if (permit !== undefined) {
    signed.push({
      scheme: "upto",
      payer: permit.from.toLowerCase(),
      nonce: uptoNonceKey(BigInt(permit.nonce)),
      value: BigInt(permit.permitted.amount)
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

interface CallResult {
  readonly status: number
  readonly hungUp: boolean
  readonly cut: boolean
  readonly complete: boolean
  readonly requestId: string | undefined
  readonly text: string
  readonly paymentRequired?: string | undefined
  readonly sessionToken?: string | undefined
}

/** The paid call itself, hung up after `hangUpAfterMs` when set; the answer read to its end otherwise. */
const call = async (
  plan: Plan,
  url: string,
  headers: Record<string, string>,
  payload: string,
  hangUpAfterMs: number | undefined
): Promise<CallResult> => {
  const abort = new AbortController()
  const timer = hangUpAfterMs === undefined ? undefined : setTimeout(() => abort.abort(), hangUpAfterMs)
  let status = 0
  let requestId: string | undefined
  let paymentRequired: string | undefined
  let sessionToken: string | undefined
  let text = ""
  try {
    const response = await fetch(url, { method: "POST", headers, body: payload, signal: abort.signal })
    status = response.status
    requestId = response.headers.get("x-request-id") ?? undefined
    sessionToken = response.headers.get("x-session-token") ?? undefined
    const header = response.headers.get("payment-required")
    if (header !== null) paymentRequired = Buffer.from(header, "base64").toString("utf8")
    text = await response.text()
    const complete = status === 200 && endedWhole(plan, text)
    return { status, hungUp: false, cut: false, complete, requestId, text, paymentRequired, sessionToken }
  } catch (error) {
    const hungUp = abort.signal.aborted
    return {
      status,
      hungUp,
      cut: !hungUp,
      complete: false,
      requestId,
      text: hungUp ? "" : String(error),
      paymentRequired,
      sessionToken
    }
  } finally {
    if (timer !== undefined) clearTimeout(timer)
  }
}
