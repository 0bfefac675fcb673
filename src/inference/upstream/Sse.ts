/**
 * An incremental Server-Sent Events decoder (WHATWG event-stream rules): bytes go in as they
 * arrive, complete events come out. Lines end in `\n`, `\r\n` or `\r` (a `\r\n` may be split
 * across chunks), UTF-8 sequences may be split across chunks, `data:` lines of one event join
 * with `\n`, lines starting with `:` are comments, and an event without a terminating blank
 * line at the end of the stream is discarded, as the spec requires: a cut-off frame must not
 * be mistaken for a whole one.
 */
export interface SseEvent {
  /** The `event:` field; undefined means the default type (`message`). */
  readonly event: string | undefined
  readonly data: string
  /** The last `id:` seen, which persists across events as in the spec. */
  readonly id: string | undefined
}

export interface SseDecoder {
  readonly push: (chunk: Uint8Array) => ReadonlyArray<SseEvent>
  /** Flushes the UTF-8 decoder at the end of the stream; an unterminated event is dropped. */
  readonly end: () => ReadonlyArray<SseEvent>
}

const LF = 10
const CR = 13

export const makeSseDecoder = (): SseDecoder => {
  const utf8 = new TextDecoder("utf-8")
  let partialLine = ""
  let skipLeadingLf = false
  let data: Array<string> = []
  let eventType: string | undefined
  let lastId: string | undefined

  const line = (text: string, out: Array<SseEvent>) => {
    if (text.length === 0) {
      if (data.length > 0) out.push({ event: eventType, data: data.join("\n"), id: lastId })
      data = []
      eventType = undefined
      return
    }
    if (text.charCodeAt(0) === 58 /* ":" */) return
    const colon = text.indexOf(":")
    const field = colon === -1 ? text : text.slice(0, colon)
    let value = colon === -1 ? "" : text.slice(colon + 1)
    if (value.startsWith(" ")) value = value.slice(1)
    switch (field) {
      case "data":
        data.push(value)
        break
      case "event":
        eventType = value
        break
      case "id":
        if (!value.includes("\u0000")) lastId = value
        break
    }
  }

  const feed = (text: string): ReadonlyArray<SseEvent> => {
    const out: Array<SseEvent> = []
    let start = 0
    if (skipLeadingLf && text.length > 0) {
      if (text.charCodeAt(0) === LF) start = 1
      skipLeadingLf = false
    }
    for (let i = start; i < text.length; i++) {
      const c = text.charCodeAt(i)
      if (c !== LF && c !== CR) continue
      line(partialLine + text.slice(start, i), out)
      partialLine = ""
      if (c === CR) {
        if (i + 1 === text.length) skipLeadingLf = true
        else if (text.charCodeAt(i + 1) === LF) i++
      }
      start = i + 1
    }
    partialLine += text.slice(start)
    return out
  }

  return {
    push: (chunk) => feed(utf8.decode(chunk, { stream: true })),
    end: () => feed(utf8.decode())
  }
}
