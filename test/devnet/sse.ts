import { Effect } from "effect"
import type { ProviderServerOptions } from "../../src/devnet/fleet/ProviderServer.ts"

export const fastOptions = (overrides: Partial<ProviderServerOptions> = {}): ProviderServerOptions => ({
  providerId: "sim-test-openai",
  dialect: "openai",
  modelClasses: ["chat-medium", "grounded-medium"],
  ttftMs: 30,
  tokensPerSecond: 4000,
  maxContext: 100_000,
  ...overrides
})

export const postJson = (url: string, body: unknown, signal?: AbortSignal) =>
  Effect.promise(() =>
    fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      ...(signal === undefined ? {} : { signal })
    })
  )

export interface ReadResult {
  readonly text: string
  /** Milliseconds from the call to the first body byte, when one arrived. */
  readonly firstByteMs: number | undefined
  /** Set when the body ended with a transport error instead of a clean end. */
  readonly error: unknown
}

/** Posts and reads the whole body, noting the time of the first byte and a broken ending. */
export const postAndRead = (url: string, body: unknown) =>
  Effect.promise(async (): Promise<ReadResult & { readonly status: number }> => {
    const started = performance.now()
    const response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body)
    })
    const reader = response.body!.getReader()
    const decoder = new TextDecoder()
    let text = ""
    let firstByteMs: number | undefined
    let error: unknown
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        firstByteMs ??= performance.now() - started
        text += decoder.decode(value, { stream: true })
      }
    } catch (cause) {
      error = cause ?? "stream error"
    }
    return { status: response.status, text, firstByteMs, error }
  })

/** `data:` payloads of an SSE body (OpenAI style). */
export const dataLines = (text: string): Array<string> =>
  text
    .split("\n\n")
    .filter((block) => block.startsWith("data: "))
    .map((block) => block.slice("data: ".length))

/** `{event, data}` pairs of an SSE body (Anthropic style). */
export const events = (
  text: string
): Array<{ event: string; data: { type: string } & Record<string, unknown> }> =>
  text
    .split("\n\n")
    .filter((block) => block.startsWith("event: "))
    .map((block) => {
      const [eventLine, dataLine] = block.split("\n")
      return { event: eventLine!.slice("event: ".length), data: JSON.parse(dataLine!.slice("data: ".length)) }
    })

export const readJson = <T>(response: Response) => Effect.promise(() => response.json() as Promise<T>)

export interface OpenAiErrorBody {
  readonly error: { readonly type: string; readonly code: string; readonly message: string }
}
export interface AnthropicErrorBody {
  readonly type: string
  readonly error: { readonly type: string; readonly message: string }
}
export type WithSources<T> = T & {
  readonly svc_sources: ReadonlyArray<{ id: string; title: string; url: string; snippet: string }>
}
