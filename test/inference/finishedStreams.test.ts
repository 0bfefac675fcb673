import { randomBytes } from "node:crypto"
import diagnostics from "node:diagnostics_channel"
import http from "node:http"
import v8 from "node:v8"
import vm from "node:vm"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import type { ProviderConfig } from "../../src/devnet/fleet/FleetConfig.ts"
import { LiveStreams } from "../../src/inference/LiveStreams.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForQuote } from "../support/Pay.ts"
import { call, RouterUrl, routerWithFleet } from "../support/Router.ts"

/**
 * Issue 12 item 5: a finished stream is kept for replay (`GET /v1/streams/:id`, an idempotent replay)
 * for minutes, so it must keep only what replay needs. The router's own HTTP request and response
 * objects of the call that started it (seen through Node's `http.server.request.start` channel) must be
 * collectable once the call ended, while its replay still answers.
 */
v8.setFlagsFromString("--expose-gc")
const gc = vm.runInNewContext("gc") as () => void

const provider: ProviderConfig = {
  providerId: "fs-1",
  dialect: "openai",
  offers: [{ modelClass: "chat-small", priceIn: 100_000, priceOut: 400_000 }],
  ttftMs: 0,
  tokensPerSecond: 100_000,
  capacityRps: 64,
  maxContext: 32_000
}

const router = routerWithFleet({}, [provider])

/** A paid streaming call on a connection of its own, closed after the reply (no keep-alive holds it). */
const streamOnce = (base: string, key: string, body: unknown) =>
  Effect.promise(
    () =>
      new Promise<{ status: number; headers: http.IncomingHttpHeaders; text: string }>((resolve, reject) => {
        const payload = JSON.stringify(body)
        const request = http.request(
          `${base}/v1/chat/completions`,
          {
            method: "POST",
            agent: false,
            headers: {
              "content-type": "application/json",
              "content-length": Buffer.byteLength(payload),
              connection: "close",
              "x-credit-key": key
            }
          },
          (response) => {
            let text = ""
            response.setEncoding("utf8")
            response.on("data", (chunk: string) => {
              text += chunk
            })
            response.on("end", () =>
              resolve({ status: response.statusCode ?? 0, headers: response.headers, text })
            )
            response.on("error", reject)
          }
        )
        request.on("error", reject)
        request.end(payload)
      })
  )

/**
 * Whether a string containing `needle` is alive in this process: a heap snapshot (taken after a full
 * collection) holds every live string, and only those.
 */
const heapHolds = (needle: string) =>
  Effect.promise(
    () =>
      new Promise<boolean>((resolve, reject) => {
        const snapshot = v8.getHeapSnapshot()
        let tail = ""
        let found = false
        snapshot.setEncoding("utf8")
        snapshot.on("data", (chunk: string) => {
          if (found) return
          const text = tail + chunk
          if (text.includes(needle)) found = true
          tail = text.slice(-needle.length)
        })
        snapshot.on("end", () => resolve(found))
        snapshot.on("error", reject)
      })
  )

/** Collects until the given objects are gone or a few passes show they are held. */
const collected = (refs: ReadonlyArray<WeakRef<object>>) =>
  Effect.promise(async () => {
    for (let pass = 0; pass < 10; pass++) {
      // A WeakRef's target lives at least to the end of the job that made or read it: collect in a later one.
      await new Promise((resolve) => setTimeout(resolve, 20))
      gc()
      if (refs.every((ref) => ref.deref() === undefined)) return true
    }
    return false
  })

describe("a finished stream", () => {
  layer(router, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("keeps its replay and lets go of the call's request and response objects", () =>
      Effect.gen(function* () {
        const base = yield* RouterUrl
        yield* waitForQuote("chat-small")
        const key = yield* fundedKey({ budget: 100_000_000, balance: 100_000_000 })

        // The prompt carries a mark made here (never a literal in code), so a snapshot finds it only
        // where the router still holds the parsed request.
        const mark = `prompt-mark-${randomBytes(8).toString("hex")}`
        const held: Array<WeakRef<object>> = []
        const onStart = (message: unknown) => {
          const { request, response } = message as {
            request: http.IncomingMessage
            response: http.ServerResponse
          }
          // The router's (the simulated provider, in this process too, serves the same path without a key).
          if (request.url === "/v1/chat/completions" && request.headers["x-credit-key"] !== undefined)
            held.push(new WeakRef(request), new WeakRef(response))
        }
        diagnostics.subscribe("http.server.request.start", onStart)
        const reply = yield* streamOnce(base, key.secret, {
          model: "chat-small",
          stream: true,
          messages: [{ role: "user", content: `what does a finished stream keep? ${mark}` }],
          max_tokens: 16
        }).pipe(
          Effect.ensuring(Effect.sync(() => diagnostics.unsubscribe("http.server.request.start", onStart)))
        )
        assert.strictEqual(reply.status, 200, reply.text)
        assert.include(reply.text, "[DONE]")
        assert.strictEqual(held.length, 2, "the router's request and response were seen")
        // The reply ends before its settlement commits (D534); what the finished work keeps is read after it.
        yield* (yield* LiveStreams).awaitDone(String(reply.headers["x-request-id"]), 5_000)

        // The stream is finished and kept: its replay answers with the same content.
        const id = String(reply.headers["x-request-id"])
        const token = String(reply.headers["x-stream-token"])
        const replay = yield* call(`/v1/streams/${id}`, { headers: { "x-stream-token": token } })
        assert.strictEqual(replay.status, 200, replay.text)
        assert.include(replay.text, "[DONE]")

        // ...and nothing of it reaches the Node request or response of the call that made it.
        assert.isTrue(yield* collected(held), "a finished stream still holds its call's request or response")

        // The kept record is the reply's bytes as the caller got them and small metadata (D270): not the
        // events, not the finished fiber (its context and exit), not the readers that followed it.
        const kept = (yield* LiveStreams).get(id)
        assert.isDefined(kept)
        assert.isDefined(kept!.finishedAt)
        assert.isUndefined(kept!.fiber)
        assert.strictEqual(kept!.readers.size, 0)
        assert.strictEqual(kept!.events.length, 0, "a finished stream keeps its events")
        assert.isUndefined(kept!.keeper)
        assert.isDefined(kept!.kept, "a finished stream keeps no encoded reply")
        assert.strictEqual(Buffer.from(kept!.kept!.body).toString("utf8"), reply.text)
        assert.strictEqual(kept!.kept!.offsets!.at(-1), kept!.kept!.body.length)

        // Collection took nothing replay needs.
        const again = yield* call(`/v1/streams/${id}`, { headers: { "x-stream-token": token } })
        assert.strictEqual(again.status, 200, again.text)
        assert.strictEqual(again.text, replay.text)

        // ...and nothing else of the call: the parsed request (its prompt) is gone (last: the snapshot
        // stops this process for seconds).
        assert.isFalse(yield* heapHolds(mark), "a finished stream still holds its call's prompt")
      })
    )
  })
})
