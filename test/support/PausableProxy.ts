import { createConnection, createServer, type Server, type Socket } from "node:net"
import { Context, Effect } from "effect"

interface Proxy {
  readonly port: number
  readonly pause: () => void
  readonly resume: () => void
}

/**
 * A loopback TCP proxy that can stall: while paused it forwards nothing in either direction and accepts
 * connections it never serves, as a database whose process was stopped would (no error, no answer).
 */
const make = (target: { readonly host: string; readonly port: number }) =>
  Effect.acquireRelease(
    Effect.callback<Proxy & { readonly server: Server }>((resume) => {
      let paused = false
      const pairs = new Set<{ client: Socket; upstream: Socket }>()
      const server = createServer((client) => {
        const upstream = createConnection(target)
        const pair = { client, upstream }
        pairs.add(pair)
        const forward = (from: Socket, to: Socket) =>
          from.on("data", (chunk) => {
            if (!to.write(chunk)) from.pause()
          })
        forward(client, upstream)
        forward(upstream, client)
        client.on("drain", () => paused || upstream.resume())
        upstream.on("drain", () => paused || client.resume())
        if (paused) {
          client.pause()
          upstream.pause()
        }
        const close = () => {
          pairs.delete(pair)
          client.destroy()
          upstream.destroy()
        }
        client.on("close", close).on("error", close)
        upstream.on("close", close).on("error", close)
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        resume(
          Effect.succeed({
            port: typeof address === "object" && address !== null ? address.port : 0,
            server,
            pause: () => {
              paused = true
              for (const { client, upstream } of pairs) {
                client.pause()
                upstream.pause()
              }
            },
            resume: () => {
              paused = false
              for (const { client, upstream } of pairs) {
                client.resume()
                upstream.resume()
              }
            }
          })
        )
      })
    }),
    (proxy) =>
      Effect.callback<void>((resume) => {
        proxy.resume()
        proxy.server.close(() => resume(Effect.void))
        // Open connections end when the pool that holds them closes.
        setTimeout(() => resume(Effect.void), 1000).unref()
      })
  )

export class PausableProxy extends Context.Service<PausableProxy, Proxy>()("test/PausableProxy") {
  static readonly make = make
}
