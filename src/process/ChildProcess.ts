import { type ChildProcess, execFileSync, type SpawnOptions, spawn } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import { type Duration, Effect } from "effect"

/**
 * The router's own child processes (the embedded Postgres and Anvil) live and die with it:
 * - each runs in its own process group, so a terminal's Ctrl-C reaches only the router, which then
 *   drains with its database and chain still up, and stops them last;
 * - on Linux each is started through `setpriv --pdeathsig`, so the kernel signals it when the router
 *   dies by any means, SIGKILL included (it then shuts down cleanly on its own);
 * - where neither helps (another OS, a kill of the whole machine), the next start finds what was
 *   left by pid (`stopLeftover`) and stops it before starting its own.
 */

const SETPRIV = "/usr/bin/setpriv"
const canTieToParent = process.platform === "linux" && existsSync(SETPRIV)

export type StopSteps = ReadonlyArray<{ readonly signal: NodeJS.Signals; readonly patience: Duration.Input }>

/**
 * Spawns `binary` in its own process group, signalled with `deathSignal` when this process dies
 * (by the kernel where it can, else by an exit hook that covers every exit but SIGKILL).
 */
export const spawnTied = (
  binary: string,
  args: ReadonlyArray<string>,
  options: SpawnOptions & { readonly deathSignal: NodeJS.Signals }
): ChildProcess => {
  const { deathSignal, ...rest } = options
  const spawnOptions: SpawnOptions = { ...rest, detached: true }
  const child = canTieToParent
    ? spawn(SETPRIV, ["--pdeathsig", deathSignal, "--", binary, ...args], spawnOptions)
    : spawn(binary, args, spawnOptions)
  const onExit = () => {
    child.kill(deathSignal)
  }
  process.once("exit", onExit)
  child.once("exit", () => process.removeListener("exit", onExit))
  return child
}

const hasExited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null

/** Stops a child of this process: each signal in turn, waiting `patience` after each for it to exit. */
export const stopChild = (child: ChildProcess, steps: StopSteps) =>
  Effect.gen(function* () {
    const exited = Effect.callback<void>((resume) => {
      if (hasExited(child) || child.pid === undefined) return resume(Effect.void)
      const onExit = () => resume(Effect.void)
      child.once("exit", onExit)
      return Effect.sync(() => child.removeListener("exit", onExit))
    })
    for (const step of steps) {
      if (hasExited(child) || child.pid === undefined) return
      child.kill(step.signal)
      const done = yield* exited.pipe(
        Effect.as(true),
        Effect.timeoutOrElse({ duration: step.patience, orElse: () => Effect.succeed(false) })
      )
      if (done) return
    }
  })

export const isAlive = (pid: number): boolean => {
  if (!Number.isSafeInteger(pid) || pid <= 0) return false
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    // EPERM: it exists but belongs to someone else.
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

/**
 * Whether `pid` still runs. A zombie does not: it has exited and only waits for whoever inherited it to
 * reap it. A child that outlives its parent is re-parented to pid 1, which on some machines (a container
 * without an init) reaps late or never, and `kill(pid, 0)` still succeeds on a zombie.
 */
export const isRunning = (pid: number): boolean => {
  if (!isAlive(pid)) return false
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0]
    return state !== "Z" && state !== "X"
  } catch {
    // Elsewhere than Linux there is no /proc to tell a zombie; on Linux it is gone by now.
    return !existsSync("/proc")
  }
}

/** The command line of a running process, or undefined when it is gone or cannot be read. */
export const commandLineOf = (pid: number): string | undefined => {
  if (!isAlive(pid)) return undefined
  try {
    if (existsSync(`/proc/${pid}/cmdline`)) {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").trim()
    }
    return execFileSync("ps", ["-o", "command=", "-p", String(pid)], { encoding: "utf8" }).trim()
  } catch {
    return undefined
  }
}

/** The pid recorded in the first line of `file`, when there is one. */
export const readPidFile = (file: string): number | undefined => {
  try {
    const pid = Number.parseInt(readFileSync(file, "utf8").split("\n")[0] ?? "", 10)
    return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined
  } catch {
    return undefined
  }
}

const signal = (pid: number, name: NodeJS.Signals) =>
  Effect.sync(() => {
    try {
      process.kill(pid, name)
    } catch {
      // already gone
    }
  })

const gone = (pid: number, within: Duration.Input) =>
  Effect.suspend(() =>
    isAlive(pid) ? Effect.as(Effect.sleep("50 millis"), false) : Effect.succeed(true)
  ).pipe(
    Effect.repeat({ until: (done) => done }),
    Effect.timeoutOrElse({ duration: within, orElse: () => Effect.succeed(false) })
  )

/**
 * Stops a process by pid: each signal in turn, waiting `patience` after each, until it is gone.
 * Returns whether it is gone.
 */
export const stopPid = (pid: number, steps: StopSteps) =>
  Effect.gen(function* () {
    for (const step of steps) {
      if (!isAlive(pid)) return true
      yield* signal(pid, step.signal)
      if (yield* gone(pid, step.patience)) return true
    }
    return !isAlive(pid)
  })

/**
 * A process an earlier run left behind (its pid in `pidFile`), stopped if it is still running and its
 * command line contains `marker` (so a recycled pid of an unrelated process is never signalled).
 * Returns the pid it stopped, if any.
 */
export const stopLeftover = Effect.fn("ChildProcess.stopLeftover")(function* (options: {
  readonly what: string
  readonly pidFile: string
  readonly marker: string
  readonly steps: StopSteps
}) {
  const pid = readPidFile(options.pidFile)
  if (pid === undefined) return undefined
  const command = commandLineOf(pid)
  if (command === undefined || !command.includes(options.marker)) return undefined
  yield* Effect.logWarning(`${options.what} left running by an earlier run: stopping it`).pipe(
    Effect.annotateLogs({ pid })
  )
  const stopped = yield* stopPid(pid, options.steps)
  if (!stopped) yield* Effect.logError(`${options.what} left running by an earlier run did not stop`, { pid })
  return pid
})
