import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import { createSecureServer } from "node:http2"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { httpPost, makeJsonRpcBatch, type RpcFailure, TRANSIENT_CODES } from "../../src/chain/JsonRpc.ts"

interface Call {
  readonly id: number
  readonly method: string
  readonly params: ReadonlyArray<unknown>
}

/**
 * A node over real HTTP (node:http on port 0) whose every answer the test writes: `answer` gets the
 * request's calls and its 0-based number and writes the response. Every request's methods are recorded.
 */
const fakeNode = (answer: (calls: ReadonlyArray<Call>, request: number, response: ServerResponse) => void) =>
  Effect.acquireRelease(
    Effect.callback<{
      readonly url: string
      readonly requests: Array<ReadonlyArray<string>>
      /** Each request's path and authorization header, as the node got them. */
      readonly heads: Array<{ readonly path: string | undefined; readonly authorization: string | undefined }>
      readonly server: Server
    }>((resume) => {
      const requests: Array<ReadonlyArray<string>> = []
      const heads: Array<{ readonly path: string | undefined; readonly authorization: string | undefined }> =
        []
      const server = createServer((request: IncomingMessage, response) => {
        heads.push({ path: request.url, authorization: request.headers.authorization })
        const chunks: Array<Buffer> = []
        request.on("data", (chunk: Buffer) => chunks.push(chunk))
        request.on("end", () => {
          const calls = JSON.parse(Buffer.concat(chunks).toString("utf8")) as ReadonlyArray<Call>
          requests.push(calls.map((call) => call.method))
          answer(calls, requests.length - 1, response)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}/`, requests, heads, server }))
      })
    }),
    (node) =>
      Effect.callback<void>((resume) => {
        node.server.closeAllConnections()
        node.server.close(() => resume(Effect.void))
      })
  )

const json = (response: ServerResponse, body: unknown, status = 200) => {
  response.writeHead(status, { "content-type": "application/json" })
  response.end(JSON.stringify(body))
}

const result = (call: Call, value: unknown) => ({ jsonrpc: "2.0", id: call.id, result: value })
const error = (call: Call, code: number, message: string) => ({
  jsonrpc: "2.0",
  id: call.id,
  error: { code, message }
})

/** Each call's result is its method and first parameter: which answer went to which call shows. */
const echo = (call: Call) => result(call, `${call.method}:${String(call.params[0])}`)

const fast = { retryDelayMs: () => 5 }

describe("makeJsonRpcBatch over HTTP (a fake node, D485/D487)", () => {
  it.effect("answers are matched by id, in whatever order they come", () =>
    Effect.gen(function* () {
      const node = yield* fakeNode((calls, _, response) => json(response, calls.map(echo).reverse()))
      const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000))
      const answers = yield* Effect.all(
        ["a", "b", "c", "d"].map((param) => rpc.call("eth_echo", [param])),
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(answers, ["eth_echo:a", "eth_echo:b", "eth_echo:c", "eth_echo:d"])
      assert.strictEqual(node.requests.length, 1)
    }).pipe(Effect.scoped)
  )

  it.effect(
    "the URL's path, query and credentials reach the node (a provider's key in the path, basic auth)",
    () =>
      Effect.gen(function* () {
        const node = yield* fakeNode((calls, _, response) => json(response, calls.map(echo)))
        const keyed =
          node.url.replace("http://", "http://rpc-user:p%40ss%3Aword@") + "v2/secret-key?network=base"
        const rpc = makeJsonRpcBatch(httpPost(keyed, 2_000))
        assert.strictEqual(yield* rpc.call("eth_echo", ["a"]), "eth_echo:a")
        const plain = makeJsonRpcBatch(httpPost(node.url, 2_000))
        assert.strictEqual(yield* plain.call("eth_echo", ["b"]), "eth_echo:b")
        assert.deepStrictEqual(node.heads, [
          {
            path: "/v2/secret-key?network=base",
            authorization: `Basic ${Buffer.from("rpc-user:p@ss:word").toString("base64")}`
          },
          { path: "/", authorization: undefined }
        ])
      }).pipe(Effect.scoped)
  )

  it.effect("to a TLS node that offers HTTP/2 it speaks HTTP/1.1, as Node's client did", () =>
    Effect.gen(function* () {
      // A self-signed certificate for 127.0.0.1, made here (openssl), trusted for this test only.
      const dir = mkdtempSync(join(tmpdir(), "svc-rpc-tls-"))
      execFileSync(
        "openssl",
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"].concat([
          "-keyout",
          join(dir, "key.pem"),
          "-out",
          join(dir, "cert.pem")
        ]),
        { stdio: "ignore" }
      )
      const versions: Array<string> = []
      const server = createSecureServer(
        {
          key: readFileSync(join(dir, "key.pem")),
          cert: readFileSync(join(dir, "cert.pem")),
          allowHTTP1: true
        },
        (request, response) => {
          versions.push(request.httpVersion)
          const chunks: Array<Buffer> = []
          request.on("data", (chunk: Buffer) => chunks.push(chunk))
          request.on("end", () => {
            const calls = JSON.parse(Buffer.concat(chunks).toString("utf8")) as ReadonlyArray<Call>
            response.writeHead(200, { "content-type": "application/json" })
            response.end(JSON.stringify(calls.map(echo)))
          })
        }
      )
      yield* Effect.acquireRelease(
        Effect.callback<void>((resume) => {
          server.listen(0, "127.0.0.1", () => resume(Effect.void))
        }),
        () =>
          Effect.sync(() => {
            server.close()
            rmSync(dir, { recursive: true, force: true })
          })
      )
      const trusted = process.env.NODE_TLS_REJECT_UNAUTHORIZED
      process.env.NODE_TLS_REJECT_UNAUTHORIZED = "0"
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          if (trusted === undefined) delete process.env.NODE_TLS_REJECT_UNAUTHORIZED
          else process.env.NODE_TLS_REJECT_UNAUTHORIZED = trusted
        })
      )
      const { port } = server.address() as AddressInfo
      const rpc = makeJsonRpcBatch(httpPost(`https://127.0.0.1:${port}/`, 5_000))
      assert.strictEqual(yield* rpc.call("eth_echo", ["a"]), "eth_echo:a")
      assert.strictEqual(yield* rpc.call("eth_echo", ["b"]), "eth_echo:b")
      assert.deepStrictEqual(versions, ["1.1", "1.1"])
    }).pipe(Effect.scoped)
  )

  it.effect(
    "a node that closes the connection without an answer fails the batch as unanswered, not timed out",
    () =>
      Effect.gen(function* () {
        const node = yield* fakeNode((_, __, response) => response.socket?.destroy())
        const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000))
        const started = Date.now()
        const failure = yield* Effect.flip(rpc.call("eth_echo", ["a"]))
        assert.deepStrictEqual(failure, {
          _tag: "Unanswered",
          timedOut: false,
          message: "the node could not be reached or answered no JSON"
        })
        assert.isBelow(Date.now() - started, 1_000)
      }).pipe(Effect.scoped)
  )

  it.effect("a call whose id is missing from the answer is sent again if it may be; else no answer", () =>
    Effect.gen(function* () {
      // The first request's answer leaves out its second call.
      const node = yield* fakeNode((calls, request, response) =>
        json(response, calls.filter((_, index) => request > 0 || index !== 1).map(echo))
      )
      const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 2, ...fast })
      const answers = yield* Effect.all(
        [rpc.call("eth_echo", ["a"]), rpc.call("eth_echo", ["b"]), rpc.call("eth_echo", ["c"])],
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(answers, ["eth_echo:a", "eth_echo:b", "eth_echo:c"])
      assert.deepStrictEqual(node.requests, [["eth_echo", "eth_echo", "eth_echo"], ["eth_echo"]])

      // Sent once: the missing answer is its failure.
      node.requests.length = 0
      const [sent, lost] = yield* Effect.all(
        [rpc.call("eth_echo", ["a"]), Effect.flip(rpc.call("eth_send", ["b"], { retry: false }))],
        { concurrency: "unbounded" }
      )
      assert.strictEqual(sent, "eth_echo:a")
      assert.deepStrictEqual(lost, { _tag: "Unanswered", timedOut: false, message: "no answer in the batch" })
      assert.strictEqual(node.requests.length, 1)
    }).pipe(Effect.scoped)
  )

  it.effect(
    "a single error object answers every call: transient ones retried, others final with its message",
    () =>
      Effect.gen(function* () {
        const node = yield* fakeNode((calls, request, response) =>
          request === 0
            ? json(response, { jsonrpc: "2.0", id: null, error: { code: -32005, message: "rate limited" } })
            : json(response, calls.map(echo))
        )
        const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 3, ...fast })
        const [read, broadcast] = yield* Effect.all(
          [rpc.call("eth_echo", ["a"]), Effect.flip(rpc.call("eth_send", ["b"], { retry: false }))],
          { concurrency: "unbounded" }
        )
        assert.strictEqual(read, "eth_echo:a")
        assert.deepStrictEqual(broadcast, {
          _tag: "Answered",
          code: -32005,
          message: "rate limited",
          data: undefined
        } satisfies RpcFailure)
        assert.deepStrictEqual(node.requests, [["eth_echo", "eth_send"], ["eth_echo"]])
      }).pipe(Effect.scoped)
  )

  it.effect("a single answer with an id (a proxy unwrapping a batch of one) answers that call", () =>
    Effect.gen(function* () {
      const node = yield* fakeNode((calls, _, response) => json(response, echo(calls[0]!)))
      const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 3, ...fast })
      assert.strictEqual(yield* rpc.call("eth_echo", ["a"]), "eth_echo:a")
      assert.strictEqual(node.requests.length, 1)
    }).pipe(Effect.scoped)
  )

  it.effect(
    "a batch refused whole with a final error fails each call with the node's message, sent once",
    () =>
      Effect.gen(function* () {
        const node = yield* fakeNode((_, __, response) =>
          json(response, {
            jsonrpc: "2.0",
            id: null,
            error: { code: -32600, message: "batch size too large" }
          })
        )
        const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 3, ...fast })
        const failures = yield* Effect.all(
          [Effect.flip(rpc.call("eth_echo", ["a"])), Effect.flip(rpc.call("eth_echo", ["b"]))],
          { concurrency: "unbounded" }
        )
        for (const failure of failures) {
          assert.deepStrictEqual(failure, {
            _tag: "Answered",
            code: -32600,
            message: "batch size too large",
            data: undefined
          })
        }
        assert.strictEqual(node.requests.length, 1)
      }).pipe(Effect.scoped)
  )

  it.effect("HTTP 5xx: calls that may be retried are sent again, a broadcast is not", () =>
    Effect.gen(function* () {
      const node = yield* fakeNode((calls, request, response) =>
        request < 2 ? json(response, { message: "busy" }, 503) : json(response, calls.map(echo))
      )
      const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 3, ...fast })
      const [read, broadcast] = yield* Effect.all(
        [rpc.call("eth_echo", ["a"]), Effect.flip(rpc.call("eth_send", ["b"], { retry: false }))],
        { concurrency: "unbounded" }
      )
      assert.strictEqual(read, "eth_echo:a")
      assert.deepStrictEqual(broadcast, { _tag: "Unanswered", timedOut: false, message: "HTTP 503" })
      assert.deepStrictEqual(node.requests, [["eth_echo", "eth_send"], ["eth_echo"], ["eth_echo"]])
    }).pipe(Effect.scoped)
  )

  it.effect("a body that stalls after the headers times out, and is retried as no answer", () =>
    Effect.gen(function* () {
      const node = yield* fakeNode((_, __, response) => {
        response.writeHead(200, { "content-type": "application/json" })
        response.write("[")
      })
      const rpc = makeJsonRpcBatch(httpPost(node.url, 150), { retries: 1, ...fast })
      const failure = yield* Effect.flip(rpc.call("eth_echo", ["a"]))
      assert.deepStrictEqual(failure, {
        _tag: "Unanswered",
        timedOut: true,
        message: "the node did not answer in time"
      })
      assert.strictEqual(node.requests.length, 2)
    }).pipe(Effect.scoped)
  )

  it.effect("per-element transient codes (viem's set) are retried; others, and broadcasts, are final", () =>
    Effect.gen(function* () {
      // Each call's first answer is an error with the code its first parameter names; later ones echo.
      const seen = new Set<string>()
      const node = yield* fakeNode((calls, _, response) =>
        json(
          response,
          calls.map((call) => {
            const key = `${call.method}:${String(call.params[0])}`
            if (seen.has(key)) return echo(call)
            seen.add(key)
            return error(call, Number(call.params[0]), `code ${String(call.params[0])}`)
          })
        )
      )
      const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 3, ...fast })
      const transient = [...TRANSIENT_CODES]
      assert.deepStrictEqual(transient.sort(), [-1, -32005, -32007, -32603, 429].sort())
      const retried = yield* Effect.all(
        transient.map((code) => rpc.call("eth_read", [code])),
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(
        retried,
        transient.map((code) => `eth_read:${code}`)
      )
      // One batch, then each call once more. The retries are timers of their own: on a loaded machine they
      // can fire in different turns and go in more than one batch (CI once saw 3 requests), so the count
      // of calls is asserted, not of requests.
      assert.lengthOf(node.requests[0]!, transient.length)
      assert.lengthOf(node.requests.slice(1).flat(), transient.length)

      node.requests.length = 0
      const final = yield* Effect.all(
        [
          Effect.flip(rpc.call("eth_read", [-32000])),
          Effect.flip(rpc.call("eth_read", [3])),
          Effect.flip(rpc.call("eth_send", [-32603], { retry: false }))
        ],
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(
        final.map((failure) => (failure._tag === "Answered" ? [failure.code, failure.message] : failure)),
        [
          [-32000, "code -32000"],
          [3, "code 3"],
          [-32603, "code -32603"]
        ]
      )
      assert.strictEqual(node.requests.length, 1)
    }).pipe(Effect.scoped)
  )

  it.effect("a transient error answered every time: after the retries, the node's error is the failure", () =>
    Effect.gen(function* () {
      const node = yield* fakeNode((calls, _, response) =>
        json(
          response,
          calls.map((call) => error(call, 429, "Your app has exceeded its compute units per second capacity"))
        )
      )
      const rpc = makeJsonRpcBatch(httpPost(node.url, 2_000), { retries: 2, ...fast })
      const failure = yield* Effect.flip(rpc.call("eth_read", []))
      assert.deepStrictEqual(failure, {
        _tag: "Answered",
        code: 429,
        message: "Your app has exceeded its compute units per second capacity",
        data: undefined
      })
      assert.strictEqual(node.requests.length, 3)
    }).pipe(Effect.scoped)
  )
})
