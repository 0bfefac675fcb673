import { createServer } from "node:net"

/** Below Linux's default ephemeral range (32768-60999), where the kernel never hands out a port by itself. */
const LOW = 20_000
const HIGH = 32_767

const bindable = (port: number) =>
  new Promise<boolean>((resolve) => {
    const server = createServer()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

/**
 * A loopback port for a router process the test starts, which binds it a second or more later. A port the
 * kernel picked (`listen(0)`) comes from the ephemeral range, and in between the kernel may give it to any
 * other socket of the suite (an outgoing connection's local end, another `listen(0)`): a start then failed
 * with EADDRINUSE. Below that range only another caller of this function could take it, one chance in
 * thousands per pair.
 */
export const listenablePort = async (): Promise<number> => {
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = LOW + Math.floor(Math.random() * (HIGH - LOW + 1))
    if (await bindable(port)) return port
  }
  throw new Error(`no free loopback port in ${LOW}-${HIGH}`)
}
