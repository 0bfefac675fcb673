import type { ChildProcess } from "node:child_process"
import { existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { Effect, Schedule, type Scope } from "effect"
import { type StopSteps, spawnTied, stopChild, stopLeftover } from "../process/ChildProcess.ts"
import { ChainError } from "./ChainError.ts"
import { DEV_ACCOUNT_COUNT, DEV_MNEMONIC } from "./DevAccounts.ts"

export const ANVIL_CHAIN_ID = 31337

/** Where a durable Anvil keeps its chain between runs (see `src/chain/EmbeddedState.ts`). */
export interface AnvilState {
  /** Loaded at start when present; written every `intervalSeconds` and when Anvil stops. */
  readonly file: string
  readonly intervalSeconds: number
  /** Holds the running Anvil's pid, so that the next start can stop one a crash left behind. */
  readonly pidFile: string
}

export interface AnvilOptions {
  /** Path to the anvil binary; defaults to the platform package `@foundry-rs/anvil-<os>-<arch>`, then `PATH`. */
  readonly binary?: string | undefined
  /** Seconds between blocks; omitted means automine (a block per transaction). */
  readonly blockTime?: number | undefined
  /** Omitted: the chain lives only as long as this Anvil. */
  readonly state?: AnvilState | undefined
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
// SIGTERM makes Anvil write its state file before it exits; a large chain takes a moment.
const STOP_STEPS: StopSteps = [
  { signal: "SIGTERM", patience: "15 seconds" },
  { signal: "SIGKILL", patience: "5 seconds" }
]

/**
 * Starts Anvil on a free port (port 0; the bound port is read from its "Listening on" line) and stops it
 * when the scope closes. Anvil prints the dev accounts' keys on stdout, so stdout is drained and never echoed.
 * With `state`, an Anvil an earlier run left behind is stopped first (which makes it write its state), and
 * the chain is loaded from and kept in `state.file`.
 */
export const launchAnvil = Effect.fn("Anvil.launch")(function* (
  options: AnvilOptions = {}
): Effect.fn.Return<AnvilInstance, ChainError, Scope.Scope> {
  const binary = options.binary ?? resolveAnvilBinary()
  const state = options.state
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
    ...(options.blockTime === undefined ? [] : ["--block-time", String(options.blockTime)]),
    ...(state === undefined ? [] : ["--state", state.file, "--state-interval", String(state.intervalSeconds)])
  ]
  if (state !== undefined) {
    yield* stopLeftover({ what: "anvil", pidFile: state.pidFile, marker: state.file, steps: STOP_STEPS })
  }

  const child = yield* Effect.acquireRelease(
    Effect.try({
      try: () => spawnAnvil(binary, args, state?.pidFile),
      catch: (cause) => new ChainError({ reason: "Devnet", message: "could not spawn anvil", cause })
    }),
    (anvil) =>
      stopChild(anvil.process, STOP_STEPS).pipe(
        Effect.andThen(
          Effect.sync(() => {
            if (state !== undefined) rmSync(state.pidFile, { force: true })
          })
        )
      )
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
}

// Everything is wired synchronously at spawn, so no early output, exit or spawn error can be missed.
const spawnAnvil = (
  binary: string,
  args: ReadonlyArray<string>,
  pidFile: string | undefined
): RunningAnvil => {
  // A router that dies (even by SIGKILL) leaves an Anvil that writes its state and exits.
  const child = spawnTied(binary, args, { stdio: ["ignore", "pipe", "pipe"], deathSignal: "SIGTERM" })
  if (pidFile !== undefined && child.pid !== undefined) {
    mkdirSync(dirname(pidFile), { recursive: true })
    writeFileSync(pidFile, `${child.pid}\n`)
  }
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
  return { process: child, listening }
}

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
