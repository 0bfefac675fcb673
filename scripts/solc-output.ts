/** The parts of solc's standard-JSON output the contract builds read (scripts/build-contracts.ts, permit2-build.ts). */

export interface ByteRange {
  readonly start: number
  readonly length: number
}

export interface SolcContract {
  readonly abi: ReadonlyArray<unknown>
  readonly evm: {
    readonly bytecode?: { readonly object: string }
    readonly deployedBytecode?: {
      readonly object: string
      readonly immutableReferences: Record<string, ReadonlyArray<ByteRange>>
    }
  }
}

export interface SolcOutput {
  readonly errors?: ReadonlyArray<{ readonly severity: string; readonly formattedMessage: string }>
  readonly sources?: Record<string, { readonly ast?: unknown }>
  readonly contracts?: Record<string, Record<string, SolcContract>>
}

/** Throws on any error; returns the warnings. */
export const solcWarnings = (output: SolcOutput): ReadonlyArray<string> => {
  const messages = output.errors ?? []
  const errors = messages.filter((m) => m.severity === "error")
  if (errors.length > 0) throw new Error(`solc failed:\n${errors.map((m) => m.formattedMessage).join("\n")}`)
  return messages.filter((m) => m.severity === "warning").map((m) => m.formattedMessage)
}
