import { type ChildProcess, spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { Effect, Schedule, type Scope } from "effect"
import { ChainError } from "./ChainError.ts"
import { DEV_ACCOUNT_COUNT, DEV_MNEMONIC } from "./DevAccounts.ts"

export const ANVIL_CHAIN_ID = 31337

export interface AnvilOptions {
  /** Path to the anvil binary; defaults to the platform package `@foundry-rs/anvil-<os>-<arch>`, then `PATH`. */
  readonly binary?: string | undefined
  /** Seconds between blocks; omitted means automine (a block per transaction). */
  readonly blockTime?: number | undefined
}

export interface AnvilInstance {
  readonly rpcUrl: string
  readonly chainId: number
  readonly pid: number
}

const npmArch: Record<string, string> = { x64: "amd64", arm64: "arm64" }

/** The binary shipped by the npm package for this platform (`@foundry-rs/anvil-linux-amd64` and siblings). */
export const resolveAnvilBinary = (): string => {
  const pkg = `@foundry-rs/anvil-${process.platform}-${npmArch[process.arch] ?? process.arch}`
  try {
    const dir = dirname(createRequire(import.meta.url).resolve(`${pkg}/package.json`))
    const binary = join(dir, "bin", process.platform === "win32" ? "anvil.exe" : "anvil")
    if (existsSync(binary)) return binary
  } catch {
    // not installed for this platform: fall back to an anvil on PATH
  }
  return "anvil"
}

const LISTENING = /Listening on (\S+):(\d+)\r?\n/
const START_TIMEOUT = "20 seconds"

/**
 * Starts Anvil on a free port (port 0; the bound port is read from its "Listening on" line) and stops it
 * when the scope closes. Anvil prints the dev accounts' keys on stdout, so stdout is drained and never echoed.
 */
export const launchAnvil = Effect.fn("Anvil.launch")(function* (
  options: AnvilOptions = {}
): Effect.fn.Return<AnvilInstance, ChainError, Scope.Scope> {
  const binary = options.binary ?? resolveAnvilBinary()
  const args = [
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--chain-id",
    String(ANVIL_CHAIN_ID),
    "--mnemonic",
    DEV_MNEMONIC,
    "--accounts",
    String(DEV_ACCOUNT_COUNT),
    ...(options.blockTime === undefined ? [] : ["--block-time", String(options.blockTime)])
  ]

  const child = yield* Effect.acquireRelease(
    Effect.try({
      try: () => spawnAnvil(binary, args),
      catch: (cause) => new ChainError({ reason: "Devnet", message: "could not spawn anvil", cause })
    }),
    stopAnvil
  )

  const rpcUrl = yield* waitForListening(child).pipe(
    Effect.timeoutOrElse({
      duration: START_TIMEOUT,
      orElse: () =>
        Effect.fail(
          new ChainError({ reason: "Devnet", message: `anvil did not start within ${START_TIMEOUT}` })
        )
    })
  )
  yield* waitForRpc(rpcUrl)
  const pid = child.process.pid ?? -1
  yield* Effect.logInfo("anvil started").pipe(Effect.annotateLogs({ rpcUrl, pid }))
  return { rpcUrl, chainId: ANVIL_CHAIN_ID, pid }
})

interface RunningAnvil {
  readonly process: ChildProcess
  /** Resolves with the RPC URL once anvil prints its "Listening on" line; rejects if it dies first. */
  readonly listening: Promise<string>
  readonly killOnExit: () => void
}

// Everything is wired synchronously at spawn, so no early output, exit or spawn error can be missed.
const spawnAnvil = (binary: string, args: ReadonlyArray<string>): RunningAnvil => {
  const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"] })
  let stdout = ""
  let stderr = ""
  let found = false
  const listening = new Promise<string>((resolve, reject) => {
    // Anvil prints the dev keys on stdout: it is searched for the listening line, never echoed, and kept
    // flowing for anvil's whole life because a full pipe would block it.
    child.stdout?.on("data", (chunk: Buffer) => {
      if (found) return
      stdout = (stdout + chunk.toString("utf8")).slice(-8192)
      const match = LISTENING.exec(stdout)
      if (match === null) return
      found = true
      stdout = ""
      resolve(`http://${match[1]}:${match[2]}`)
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      stderr = (stderr + chunk.toString("utf8")).slice(-2000)
    })
    child.once("exit", (code, signal) =>
      reject(new Error(`anvil exited before listening (code ${code}, signal ${signal}): ${stderr.trim()}`))
    )
    child.once("error", (cause) => reject(new Error(`anvil failed to start: ${cause.message}`)))
  })
  listening.catch(() => {})
  // A node process that exits without closing the scope (crash, process.exit) must not leave anvil behind.
  const killOnExit = () => {
    child.kill("SIGKILL")
  }
  process.once("exit", killOnExit)
  return { process: child, listening, killOnExit }
}

const hasExited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null

const stopAnvil = (anvil: RunningAnvil) =>
  Effect.callback<void>((resume) => {
    process.removeListener("exit", anvil.killOnExit)
    const child = anvil.process
    if (hasExited(child) || child.pid === undefined) {
      resume(Effect.void)
      return
    }
    const escalate = setTimeout(() => child.kill("SIGKILL"), 3000)
    child.once("exit", () => {
      clearTimeout(escalate)
      resume(Effect.void)
    })
    child.kill("SIGTERM")
  })

const waitForListening = (anvil: RunningAnvil) =>
  Effect.tryPromise({
    try: () => anvil.listening,
    catch: (cause) =>
      new ChainError({
        reason: "Devnet",
        message: cause instanceof Error ? cause.message : String(cause),
        cause
      })
  })

const waitForRpc = (rpcUrl: string) =>
  Effect.tryPromise({
    try: (signal) =>
      fetch(rpcUrl, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] }),
        signal
      }).then((response) => {
        if (!response.ok) throw new Error(`HTTP ${response.status}`)
        return response.json()
      }),
    catch: (cause) =>
      new ChainError({ reason: "Devnet", message: "anvil does not answer eth_chainId", cause })
  }).pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 100 }), Effect.asVoid)
