import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import { waitFor } from "../support/Pay.ts"

const BIN = fileURLToPath(new URL("../../bin/svc-setup.mjs", import.meta.url))

export interface CliRun {
  readonly child: ChildProcess
  /** Everything written so far to stdout and stderr. */
  readonly stdout: () => string
  readonly stderr: () => string
  /** The exit code, once the command ends. */
  readonly exitCode: Effect.Effect<number | null>
}

/**
 * The `svc-setup` command as a user runs it: the package's bin, a real process, on the project's Node.
 * Killed with the scope if still running.
 */
export const runCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.acquireRelease(
    Effect.sync((): CliRun => {
      const child = spawn(process.execPath, [BIN, ...args], {
        env: { ...process.env, ...env },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let stdout = ""
      let stderr = ""
      child.stdout!.on("data", (chunk) => {
        stdout += chunk
      })
      child.stderr!.on("data", (chunk) => {
        stderr += chunk
      })
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)))
      return { child, stdout: () => stdout, stderr: () => stderr, exitCode: Effect.promise(() => exited) }
    }),
    (run) => Effect.sync(() => run.child.exitCode === null && run.child.kill("SIGKILL"))
  )

/** The user code the command printed (it prints it on a line of its own). */
export const printedUserCode = (run: CliRun) =>
  waitFor(
    "the command's user code",
    Effect.sync(() => /^ {2}([B-Z]{4}-[B-Z]{4})$/m.exec(run.stdout())?.[1]),
    60_000
  )
