/**
 * What a process tree costs, read from Linux's /proc: CPU time (utime + stime of
 * /proc/<pid>/stat, in clock ticks) and resident memory (VmRSS of /proc/<pid>/status), summed per
 * kind of process under a root pid (the router's node processes, its Postgres, its Anvil).
 */
import { execFileSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"

const ticksPerSecond = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100
  } catch {
    return 100
  }
})()

interface Stat {
  readonly pid: number
  readonly comm: string
  readonly ppid: number
  readonly cpuMs: number
}

/** `/proc/<pid>/stat`, or with `thread` `/proc/<pid>/task/<thread>/stat` (one thread's own CPU time). */
const readStat = (pid: number, thread?: number): Stat | undefined => {
  try {
    const text = readFileSync(
      thread === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${thread}/stat`,
      "utf8"
    )
    // comm is in parentheses and may contain spaces: split after the last ")".
    const close = text.lastIndexOf(")")
    const comm = text.slice(text.indexOf("(") + 1, close)
    const fields = text.slice(close + 2).split(" ")
    // fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    const ppid = Number(fields[1])
    const ticks = Number(fields[11]) + Number(fields[12])
    return { pid, comm, ppid, cpuMs: (ticks * 1000) / ticksPerSecond }
  } catch {
    return undefined
  }
}

export const rssBytes = (pid: number): number => {
  try {
    const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
    return match ? Number(match[1]) * 1024 : 0
  } catch {
    return 0
  }
}

/** The root and every process below it. */
export const tree = (root: number): ReadonlyArray<Stat> => {
  const all: Array<Stat> = []
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    const stat = readStat(Number(name))
    if (stat !== undefined) all.push(stat)
  }
  const found = new Map<number, Stat>()
  const rootStat = all.find((stat) => stat.pid === root)
  if (rootStat === undefined) return []
  found.set(root, rootStat)
  let grew = true
  while (grew) {
    grew = false
    for (const stat of all) {
      if (!found.has(stat.pid) && found.has(stat.ppid)) {
        found.set(stat.pid, stat)
        grew = true
      }
    }
  }
  return [...found.values()]
}

/** Nanoseconds the process ran and waited, runnable, for a CPU (/proc/<pid>/schedstat, all threads). */
const schedstat = (pid: number): { ran: number; waited: number } => {
  try {
    const [ran, waited] = readFileSync(`/proc/${pid}/schedstat`, "utf8").trim().split(" ").map(Number)
    return { ran: ran ?? 0, waited: waited ?? 0 }
  } catch {
    return { ran: 0, waited: 0 }
  }
}

export type Kind = "node" | "postgres" | "anvil" | "other"
const kindOf = (comm: string): Kind =>
  comm.startsWith("node") || comm === "MainThread"
    ? "node"
    : comm.startsWith("postgres") || comm.startsWith("postmaster")
      ? "postgres"
      : comm.startsWith("anvil")
        ? "anvil"
        : "other"

export interface Usage {
  readonly cpuMs: Readonly<Record<Kind, number>>
  /** The node processes' main threads alone (the JavaScript event loop; not worker, GC or libuv threads). */
  readonly nodeMainCpuMs: number
  readonly rss: Readonly<Record<Kind, number>>
  /** The node processes' run and run-queue wait times (ns): how much the machine's load held them back. */
  readonly nodeRanNs: number
  readonly nodeWaitedNs: number
}

/** CPU milliseconds and RSS bytes of a process tree, per kind. */
export const usage = (root: number): Usage => {
  const cpuMs: Record<Kind, number> = { node: 0, postgres: 0, anvil: 0, other: 0 }
  const rss: Record<Kind, number> = { node: 0, postgres: 0, anvil: 0, other: 0 }
  let nodeMainCpuMs = 0
  let nodeRanNs = 0
  let nodeWaitedNs = 0
  for (const stat of tree(root)) {
    const kind = kindOf(stat.comm)
    cpuMs[kind] += stat.cpuMs
    rss[kind] += rssBytes(stat.pid)
    if (kind === "node") {
      // The main thread's id is the process id.
      nodeMainCpuMs += readStat(stat.pid, stat.pid)?.cpuMs ?? 0
      const { ran, waited } = schedstat(stat.pid)
      nodeRanNs += ran
      nodeWaitedNs += waited
    }
  }
  return { cpuMs, nodeMainCpuMs, rss, nodeRanNs, nodeWaitedNs }
}

/** What a Postgres process is, from its title (`postgres: walwriter`, `postgres: <user> <db> … idle`): its role. */
const postgresRole = (pid: number): string => {
  try {
    const title = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").trim()
    const role = /^postgres: (.+)$/.exec(title)?.[1]
    if (role === undefined) return "postmaster"
    for (const known of [
      "walwriter",
      "checkpointer",
      "background writer",
      "autovacuum launcher",
      "autovacuum worker",
      "logical replication launcher",
      "io worker",
      "walsummarizer"
    ])
      if (role.startsWith(known)) return known
    return "backends"
  } catch {
    return "gone"
  }
}

/**
 * CPU milliseconds of the Postgres processes under `root`, by role (backends, walwriter, checkpointer,
 * autovacuum workers…), and `exited`: what the postmaster's children that ended meanwhile used (its
 * cutime + cstime), so a short-lived autovacuum worker is counted too.
 */
export const postgresCpuByRole = (root: number): Record<string, number> => {
  const byRole: Record<string, number> = {}
  for (const stat of tree(root)) {
    if (kindOf(stat.comm) !== "postgres") continue
    const role = postgresRole(stat.pid)
    byRole[role] = (byRole[role] ?? 0) + stat.cpuMs
    if (role === "postmaster") {
      try {
        const text = readFileSync(`/proc/${stat.pid}/stat`, "utf8")
        const fields = text.slice(text.lastIndexOf(")") + 2).split(" ")
        byRole.exited =
          (byRole.exited ?? 0) + ((Number(fields[13]) + Number(fields[14])) * 1000) / ticksPerSecond
      } catch {}
    }
  }
  return byRole
}
