import type { ChatCompletionRequest } from "../domain/Chat.ts"
import type { PaidCallError } from "../domain/Errors.ts"
import { randomText } from "../domain/RandomText.ts"
import type { PaymentSource } from "../ledger/Ledger.ts"
import type { AuctionCleared } from "../market/Auction.ts"
import type { HeldLease } from "../market/QuoteBook.ts"
import type { Funding } from "../payment/Funding.ts"
import type { SignatureCheck } from "../payment/PaymentSignature.ts"
import type { FinishReason, UpstreamEvent } from "./Events.ts"
import type { LiveStream } from "./LiveStreams.ts"

/** The records of a paid request, shared by every step of the lifecycle and every dialect's encoder. */

export interface AgentHeaders {
  readonly role?: string | undefined
  readonly parentTask?: string | undefined
  readonly agentId?: string | undefined
}

export interface PaidRequestContext {
  readonly dialect: "openai" | "anthropic" | "responses"
  readonly paymentHeader: string | undefined
  /** The payment header's signature check, when it was made before admission (an idempotent call's scope). */
  readonly signed?: SignatureCheck | undefined
  /** `x-session-token`: a later turn of an open session. */
  readonly sessionToken?: string | undefined
  /** `x-credit-key`: spend a funded key's budget instead of signing per request. */
  readonly creditKey?: string | undefined
  /** `x-task-token`: the call is one of a durable task's steps, held within the task's budget. */
  readonly taskToken?: string | undefined
  /** A call the router makes for a task itself (its rubric review): held like a `x-task-token` call. */
  readonly taskId?: string | undefined
  readonly resourceUrl: string
  readonly agent: AgentHeaders
}

export interface MeteredUsage {
  readonly promptTokens: number
  readonly completionTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
  /** Which counts are the router's tokenizer estimate rather than the provider's report. */
  readonly estimated: { readonly prompt: boolean; readonly completion: boolean; readonly reasoning: boolean }
}

export interface ServeSummary {
  readonly status: "ok" | "partial" | "released"
  readonly finishReason: FinishReason | null
  readonly providerId: string
  readonly modelClass: string
  readonly usage: MeteredUsage
  readonly charged: number
  readonly authorized: number
  readonly ttftMs: number
  readonly error: { readonly code: string; readonly message: string } | null
}

/**
 * Whether the provider broke off mid-answer (or the request was stopped): the receipt says
 * `partial` and names the error. Every dialect's reply then says so too (D152): chat a
 * `finish_reason` of `"error"` and no `stop` after its error chunk, Messages a `null` `stop_reason`
 * (or its `error` event), Responses `failed`.
 */
export const wasCut = (summary: ServeSummary) => summary.status === "partial" && summary.error !== null

/** What a reader of a served request sees: content as it arrives, then exactly one `End`. */
export type ServeEvent =
  | { readonly _tag: "Delta"; readonly event: Exclude<UpstreamEvent, { _tag: "Usage" | "Finish" }> }
  | { readonly _tag: "End"; readonly summary: ServeSummary }

export type { Funding }

/** A request that is paid for and ready to serve: the output of admission, the input of `Serve`. */
export interface Launch {
  readonly requestId: string
  readonly createdAt: number
  readonly request: ChatCompletionRequest
  readonly auction: AuctionCleared
  readonly payer: string
  readonly funding: Funding
  readonly source: PaymentSource
  readonly authorized: number
  readonly promptEstimate: number
  /** Prompt tokens a session's provider holds in its cache: they bill at the cached rate. */
  readonly cachedEstimate: number
  /** Returned once, when this request opened a session. */
  readonly sessionToken: string | undefined
  readonly agent: Record<string, string>
  /** At most this is charged: the task budget hold a task's call took (the hold is its own cap). */
  readonly chargeCap?: number | undefined
  /** The winner's capacity lease, when the reservation's own statement asked for it (D311). */
  readonly lease?: HeldLease | undefined
}

/** An admitted request being served: what the caller's encoder reads. */
export interface Admitted {
  readonly requestId: string
  readonly createdAt: number
  readonly request: ChatCompletionRequest
  readonly auction: AuctionCleared
  readonly funding: Funding
  readonly stream: LiveStream<ServeEvent>
  readonly streamToken: string
  /** Returned once, when this request opened a session. */
  readonly sessionToken: string | undefined
}

export type CompletionError = PaidCallError

export const newRequestId = () => `req_${randomText(12, "hex")}`

/** What a reservation records about the request, before funding says who pays and how much. */
export const reservationOf = (
  requestId: string,
  dialect: string,
  requestedModel: string,
  winner: { readonly provider_id: string; readonly model_class: string },
  agent: AgentHeaders
) => ({
  requestId,
  dialect,
  requestedModel,
  modelClass: winner.model_class,
  providerId: winner.provider_id,
  agent: agentRecord(agent)
})

export const agentRecord = (agent: AgentHeaders): Record<string, string> => {
  const record: Record<string, string> = {}
  if (agent.role !== undefined) record.role = agent.role
  if (agent.parentTask !== undefined) record.parent_task = agent.parentTask
  if (agent.agentId !== undefined) record.agent_id = agent.agentId
  return record
}
