/**
 * The processes a bench run starts (`npm run bench:load`, `npm run soak`): each a node process of its own
 * with its output in a log file, stopped together at the end (SIGTERM, then SIGKILL after a grace), and the
 * router's command line taken from `npm start` so a run drives what users run.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { openSync, readFileSync } from "node:fs"
import { createServer } from "node:net"
import { join, resolve } from "node:path"

export const root = resolve(import.meta.dirname, "../..")
export const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms))

/** A loopback port free when asked (the kernel picks it). */
export const freePort = () =>
  new Promise<number>((done, fail) => {
    const server = createServer()
    server.once("error", fail)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address ? address.port : 0
      server.close(() => done(port))
    })
  })

/** The router's command, taken from `npm start`: the node arguments after `node` (the script execs it, D570). */
export const routerArgs = (): ReadonlyArray<string> => {
  const scripts = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).scripts as Record<
    string,
    string
  >
  const words = scripts.start!.split(/\s+/)
  const command = words[0] === "exec" ? words.slice(1) : words
  if (command[0] !== "node") throw new Error(`npm start is not a node command: ${scripts.start}`)
  return command.slice(1)
}

/** POSTs JSON and returns the body; a non-2xx answer is an error naming the status. */
export const post = async (url: string, body: unknown, headers: Record<string, string> = {}) => {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body)
  })
  const text = await response.text()
  if (!response.ok) throw new Error(`${url}: ${response.status} ${text.slice(0, 300)}`)
  return text
}

/** The node processes of one run. `expectExit` marks a child whose exit is planned (not reported). */
export class Children {
  readonly all: Array<ChildProcess> = []
  private readonly planned = new Set<ChildProcess>()
  stopping = false

  private readonly log: (line: string) => void

  constructor(log: (line: string) => void) {
    this.log = log
    process.on("exit", () => this.signalAll("SIGTERM"))
  }

  start(name: string, args: ReadonlyArray<string>, env: Record<string, string>, logFile: string) {
    const out = openSync(logFile, "a")
    const child = spawn(process.execPath, [...args], {
      cwd: root,
      env: { ...process.env, ...env },
      stdio: ["ignore", out, out]
    })
    child.on("exit", (code, signal) => {
      if (!this.stopping && !this.planned.has(child))
        this.log(`${name} exited early (${code ?? signal}); its log: ${logFile}`)
    })
    this.all.push(child)
    return child
  }

  /** This child's exit is part of the run (a planned SIGKILL): not reported, not waited for. */
  expectExit(child: ChildProcess) {
    this.planned.add(child)
  }

  private readonly cleanups: Array<() => void> = []

  /**
   * Runs `cleanup` when a signal stops the run, once every child has exited (a run's temporary data folder,
   * which its Postgres writes into until it stops): a signal exits without the run's own `finally`.
   */
  atSignalExit(cleanup: () => void) {
    this.cleanups.push(cleanup)
  }

  /**
   * Ctrl-C or SIGTERM of the run stops the children, and the run once they have exited (at most 30 s later),
   * after its cleanups.
   */
  stopOnSignals() {
    for (const signal of ["SIGINT", "SIGTERM"] as const) {
      process.on(signal, async () => {
        this.stopping = true
        this.signalAll("SIGTERM")
        const exited = () => this.all.every((child) => child.exitCode !== null || child.signalCode !== null)
        const deadline = Date.now() + 30_000
        while (!exited() && Date.now() < deadline) await sleep(250)
        // A child still running (past 30 s) may still write there: its folder is left, and said so.
        if (exited()) for (const cleanup of this.cleanups) cleanup()
        else this.log("children still running after 30 s; their data is left in place")
        process.exit(130)
      })
    }
  }

  signalAll(signal: NodeJS.Signals) {
    for (const child of this.all) if (child.exitCode === null && child.signalCode === null) child.kill(signal)
  }

  /** Polls `probe` until it holds; fails when `seconds` pass or an unplanned child exits meanwhile. */
  async waitFor(what: string, probe: () => Promise<boolean>, seconds: number) {
    const deadline = Date.now() + seconds * 1000
    while (Date.now() < deadline) {
      if (await probe().catch(() => false)) return
      if (this.all.some((child) => child.exitCode !== null && !this.planned.has(child)))
        throw new Error(`a process exited while waiting for ${what}`)
      await sleep(250)
    }
    throw new Error(`${what} did not come up within ${seconds} s`)
  }

  /** SIGTERM to every child still running, SIGKILL to those still running after `graceMs`. */
  async stopAll(graceMs = 20_000) {
    this.stopping = true
    this.signalAll("SIGTERM")
    const deadline = Date.now() + graceMs
    while (
      this.all.some((child) => child.exitCode === null && child.signalCode === null) &&
      Date.now() < deadline
    )
      await sleep(200)
    this.signalAll("SIGKILL")
  }
}
