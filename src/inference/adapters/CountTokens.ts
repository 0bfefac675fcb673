import { Result } from "effect"
import type { CountTokensRequest } from "../../domain/Messages.ts"
import { countTextTokens, estimatePromptTokens } from "../Tokens.ts"
import type { TranslationError } from "./Common.ts"
import { messagesToChatRequest } from "./MessagesRequest.ts"

/**
 * `POST /v1/messages/count_tokens`: the router's own estimate with the same BPE tokenizer that
 * sizes the worst-case authorization, over the translated prompt plus each tool definition as
 * JSON. No auction, no payment, no provider call.
 */
export const countMessagesTokens = (
  request: CountTokensRequest
): Result.Result<{ readonly input_tokens: number }, TranslationError> =>
  Result.map(messagesToChatRequest(request), (chat) => {
    const tools = (request.tools ?? []).reduce((sum, tool) => sum + countTextTokens(JSON.stringify(tool)), 0)
    return { input_tokens: estimatePromptTokens(chat.messages) + tools }
  })
