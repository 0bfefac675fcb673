import { Schema, SchemaTransformation } from "effect"
import { HttpApiSchema } from "effect/http-api"
import { OpenAiErrorBody } from "../domain/Chat.ts"
import { type DialectError, type DialectErrors, errorTypes } from "../domain/Errors.ts"
import { MessagesErrorBody as AnthropicErrorBody } from "../domain/Messages.ts"
import { PaymentRequired, paymentRequiredHeader } from "../domain/X402.ts"

/**
 * The one place that knows how each dialect spells an error. Endpoint definitions list
 * `openAi(X)` or `anthropic(X)` so the compiler tracks which endpoint fails how, and
 * the body on the wire is the dialect's own.
 */
export type Dialect = "openai" | "anthropic"

type ErrorClass = (typeof DialectErrors)[number]
type Encoded = {
  readonly _tag: DialectError["_tag"]
  readonly message: string
  readonly code: string
  readonly param?: string
}

const statusOf = (cls: ErrorClass): number => {
  const status = cls.ast.annotations?.httpApiStatus
  return typeof status === "number" ? status : 500
}
const tagOf = (cls: ErrorClass) => cls.ast.annotations?.identifier as DialectError["_tag"]
const asCodec = (cls: ErrorClass) => cls as unknown as Schema.Codec<DialectError, Encoded>

/**
 * A 503 is always a condition to wait out (the database faulting, a busy or empty market, a draining
 * instance): its body says `retryable: true` in either dialect, beside the `Retry-After` header the
 * middleware sets (D210).
 */
const retryableOf = (e: Encoded) => (e._tag === "ServiceUnavailable" ? { retryable: true } : {})

export const openAiBody = (e: Encoded) => ({
  error: {
    message: e.message,
    type: errorTypes[e._tag].openai,
    code: e.code,
    param: e.param ?? null,
    ...retryableOf(e)
  }
})
export const anthropicBody = (e: Encoded) => ({
  type: "error" as const,
  error: { type: errorTypes[e._tag].anthropic, message: e.message, ...retryableOf(e) }
})

export const openAi = <C extends ErrorClass>(cls: C) => {
  const tag = tagOf(cls)
  return OpenAiErrorBody.pipe(
    Schema.decodeTo(
      asCodec(cls),
      SchemaTransformation.transform<Encoded, typeof OpenAiErrorBody.Type>({
        decode: (b) => ({
          _tag: tag,
          message: b.error.message,
          code: b.error.code ?? b.error.type,
          ...(b.error.param === null ? {} : { param: b.error.param })
        }),
        encode: openAiBody
      })
    ),
    HttpApiSchema.status(statusOf(cls))
  ) as unknown as Schema.Codec<InstanceType<C>, typeof OpenAiErrorBody.Encoded>
}

export const anthropic = <C extends ErrorClass>(cls: C) => {
  const tag = tagOf(cls)
  return AnthropicErrorBody.pipe(
    Schema.decodeTo(
      asCodec(cls),
      SchemaTransformation.transform<Encoded, typeof AnthropicErrorBody.Type>({
        decode: (b) => ({ _tag: tag, message: b.error.message, code: b.error.type }),
        encode: anthropicBody
      })
    ),
    HttpApiSchema.status(statusOf(cls))
  ) as unknown as Schema.Codec<InstanceType<C>, typeof AnthropicErrorBody.Encoded>
}

const { _tag: _, ...paymentFields } = PaymentRequired.fields
const PaymentRequiredBody = Schema.Struct(paymentFields).pipe(HttpApiSchema.status(402))

/** 402 with the spec 2.7 body in every dialect, and the same requirements base64 in `PAYMENT-REQUIRED`. */
export const PaymentRequiredWire = PaymentRequired.pipe(
  HttpApiSchema.encodeToWithHeaders(
    { body: PaymentRequiredBody, headers: { "payment-required": Schema.String } },
    {
      decode: ({ body }) => new PaymentRequired(body),
      encode: (e) => {
        const { _tag: _t, ...body } = e
        return { body, headers: { "payment-required": paymentRequiredHeader(body) } }
      }
    }
  )
)
