import {
  closeSync,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  writeSync
} from "node:fs"
import { join } from "node:path"
import { Effect, Option, Schema } from "effect"
import type { AnvilState } from "./Anvil.ts"
import { ChainError } from "./ChainError.ts"

/**
 * The embedded chain's files in `DATA_DIR/chain` (docs/decisions.md D80):
 * - `anvil-state.json`: Anvil's own state dump (accounts, contracts, blocks, transactions), loaded at start,
 *   written by Anvil every `STATE_INTERVAL_SECONDS` and when it stops;
 * - `anvil-state.backup.json`: the last dump that was whole when a start read it;
 * - `contracts.json`: where this chain's contracts were deployed, so a restart reuses them;
 * - `anvil.pid`: the running Anvil, for the next start to stop one a crash left behind.
 * Anvil rewrites its dump in place, so a dump cut short (Anvil killed mid-write, a power loss) is possible:
 * the start that finds one falls back to the backup.
 */
export const STATE_INTERVAL_SECONDS = 2

export const EmbeddedContracts = Schema.Struct({
  chainId: Schema.Number,
  token: Schema.String,
  anchor: Schema.String
})
export type EmbeddedContracts = typeof EmbeddedContracts.Type

const paths = (dir: string) => ({
  state: join(dir, "anvil-state.json"),
  backup: join(dir, "anvil-state.backup.json"),
  contracts: join(dir, "contracts.json"),
  pid: join(dir, "anvil.pid")
})

/** Writes `text` so that a reader sees the old file or the new one, never a part of it. */
export const writeAtomically = (file: string, text: string) => {
  const temporary = `${file}.tmp-${process.pid}`
  const fd = openSync(temporary, "w")
  try {
    writeSync(fd, text)
    fsyncSync(fd)
  } finally {
    closeSync(fd)
  }
  renameSync(temporary, file)
}

const isWholeDump = (file: string) => {
  try {
    const parsed: unknown = JSON.parse(readFileSync(file, "utf8"))
    return typeof parsed === "object" && parsed !== null && "accounts" in parsed && "block" in parsed
  } catch {
    return false
  }
}

const fail = (message: string) => (cause: unknown) => new ChainError({ reason: "Devnet", message, cause })

/**
 * Makes `DATA_DIR/chain` ready for Anvil: a whole dump is backed up; a dump cut short is replaced by the
 * backup (logged: what happened on chain after that backup is gone, reconciliation will say what).
 */
export const prepareState = Effect.fn("EmbeddedState.prepare")(function* (dir: string) {
  const files = paths(dir)
  yield* Effect.try({
    try: () => mkdirSync(dir, { recursive: true }),
    catch: fail("cannot create the chain folder")
  })
  if (existsSync(files.state)) {
    if (isWholeDump(files.state)) {
      yield* Effect.try({
        try: () => writeAtomically(files.backup, readFileSync(files.state, "utf8")),
        catch: fail("cannot back up the chain state")
      })
    } else {
      const restore = existsSync(files.backup) && isWholeDump(files.backup)
      yield* Effect.logError(
        restore
          ? "the embedded chain's state file is damaged: starting from its backup, taken at the previous start"
          : "the embedded chain's state file is damaged and has no backup: starting a fresh chain"
      ).pipe(Effect.annotateLogs({ file: files.state }))
      yield* Effect.try({
        try: () => {
          renameSync(files.state, `${files.state}.damaged-${process.pid}`)
          if (restore) writeAtomically(files.state, readFileSync(files.backup, "utf8"))
        },
        catch: fail("cannot restore the chain state")
      })
    }
  }
  return {
    file: files.state,
    intervalSeconds: STATE_INTERVAL_SECONDS,
    pidFile: files.pid
  } satisfies AnvilState
})

/** The contracts a previous run deployed on this chain, if it recorded them. */
export const readContracts = (dir: string) =>
  Effect.try({
    try: () => readFileSync(paths(dir).contracts, "utf8"),
    catch: () => undefined
  }).pipe(
    Effect.flatMap((text) => Schema.decodeUnknownEffect(Schema.fromJsonString(EmbeddedContracts))(text)),
    Effect.option,
    Effect.map(Option.getOrUndefined)
  )

export const writeContracts = (dir: string, contracts: EmbeddedContracts) =>
  Effect.try({
    try: () => writeAtomically(paths(dir).contracts, `${JSON.stringify(contracts, null, 2)}\n`),
    catch: fail("cannot record the deployed contracts")
  })
