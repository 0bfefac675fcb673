/**
 * Compiles Uniswap's Permit2 from the Solidity sources shipped in the npm package `@uniswap/v4-periphery`
 * (`lib/permit2/src`, solmate under `lib/permit2/lib/solmate`) with solc 0.8.17 (the npm alias `solc-0.8.17`;
 * five Permit2 files pin `pragma solidity 0.8.17`) and Permit2's own settings (its foundry.toml: optimizer
 * 1,000,000 runs, via-IR, no metadata hash). Renders src/chain/permit2Artifact.ts: the ABI, the runtime
 * bytecode with its two immutables left zero, and where those immutables sit, so that src/chain/Permit2.ts can
 * fill in the cached chain id and domain separator of the canonical address before `anvil_setCode`.
 */
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join, normalize, sep } from "node:path"
import { fileURLToPath } from "node:url"
import { type ByteRange, type SolcOutput, solcWarnings } from "./solc-output.ts"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
export const permit2ArtifactPath = join(root, "src", "chain", "permit2Artifact.ts")

const require = createRequire(import.meta.url)
const peripheryDir = dirname(require.resolve("@uniswap/v4-periphery/package.json"))
const peripheryVersion: string = JSON.parse(readFileSync(join(peripheryDir, "package.json"), "utf8")).version
const permit2Dir = join(peripheryDir, "lib", "permit2")

interface Solc {
  readonly compile: (input: string, callbacks: { readonly import: (path: string) => ImportResult }) => string
  readonly version: () => string
}
type ImportResult = { readonly contents: string } | { readonly error: string }

// solc-js 0.8.17 ships no type declarations; this is the part of its API used here.
const solc017: Solc = require("solc-0.8.17")

/** Names of the immutables in Permit2's EIP712.sol, the only ones it has. */
export const PERMIT2_IMMUTABLES = ["_CACHED_CHAIN_ID", "_CACHED_DOMAIN_SEPARATOR"] as const
export type Permit2Immutable = (typeof PERMIT2_IMMUTABLES)[number]

const settings = {
  optimizer: { enabled: true, runs: 1_000_000 },
  viaIR: true,
  evmVersion: "london",
  metadata: { bytecodeHash: "none" },
  remappings: ["solmate/=lib/solmate/"],
  outputSelection: {
    "*": { "": ["ast"] },
    "src/Permit2.sol": {
      Permit2: ["abi", "evm.deployedBytecode.object", "evm.deployedBytecode.immutableReferences"]
    }
  }
}

export interface Permit2Compilation {
  readonly compilerVersion: string
  readonly peripheryVersion: string
  readonly abi: ReadonlyArray<unknown>
  readonly runtimeBytecode: string
  readonly immutables: Record<Permit2Immutable, ReadonlyArray<ByteRange>>
  readonly warnings: ReadonlyArray<string>
}

// Sources are named by their path inside the Permit2 repository, as its own build names them; an import that
// would leave that directory is refused.
const readSource = (path: string): ImportResult => {
  const file = normalize(join(permit2Dir, path))
  if (!file.startsWith(permit2Dir + sep)) return { error: `import outside Permit2: ${path}` }
  try {
    return { contents: readFileSync(file, "utf8") }
  } catch {
    return { error: `not found: ${path}` }
  }
}

/** Every `VariableDeclaration` node of the ASTs: name → AST id. */
const declarationIds = (node: unknown, into: Map<string, number>): Map<string, number> => {
  if (Array.isArray(node)) {
    for (const child of node) declarationIds(child, into)
  } else if (typeof node === "object" && node !== null) {
    const record = node as Record<string, unknown>
    if (
      record.nodeType === "VariableDeclaration" &&
      typeof record.name === "string" &&
      typeof record.id === "number"
    ) {
      into.set(record.name, record.id)
    }
    for (const value of Object.values(record)) declarationIds(value, into)
  }
  return into
}

export const compilePermit2 = (): Permit2Compilation => {
  const entry = readSource("src/Permit2.sol")
  if (!("contents" in entry)) throw new Error(`Permit2 sources missing: ${entry.error}`)
  const input = {
    language: "Solidity",
    sources: { "src/Permit2.sol": { content: entry.contents } },
    settings
  }
  const output: SolcOutput = JSON.parse(solc017.compile(JSON.stringify(input), { import: readSource }))
  const warnings = solcWarnings(output)
  const compiled = output.contracts?.["src/Permit2.sol"]?.Permit2
  const deployed = compiled?.evm.deployedBytecode
  if (compiled === undefined || deployed === undefined || deployed.object.length === 0) {
    throw new Error("solc produced no bytecode for Permit2")
  }
  const ids = declarationIds(
    Object.values(output.sources ?? {}).map((s) => s.ast),
    new Map()
  )
  const references = deployed.immutableReferences
  const named = (name: Permit2Immutable) => {
    const ranges = references[String(ids.get(name))]
    if (ranges === undefined) throw new Error(`Permit2 has no immutable ${name}`)
    return ranges.map(({ start, length }) => ({ start, length }))
  }
  if (Object.keys(references).length !== PERMIT2_IMMUTABLES.length) {
    throw new Error(`Permit2 has ${Object.keys(references).length} immutables, expected 2`)
  }
  return {
    compilerVersion: solc017.version(),
    peripheryVersion,
    abi: compiled.abi,
    runtimeBytecode: `0x${deployed.object}`,
    immutables: {
      _CACHED_CHAIN_ID: named("_CACHED_CHAIN_ID"),
      _CACHED_DOMAIN_SEPARATOR: named("_CACHED_DOMAIN_SEPARATOR")
    },
    warnings
  }
}

export const renderPermit2Artifact = (compilation: Permit2Compilation): string =>
  [
    "// biome-ignore-all format: generated by scripts/build-contracts.ts (npm run build:contracts); do not edit",
    `// Permit2 from @uniswap/v4-periphery ${compilation.peripheryVersion} lib/permit2/src, compiled with solc ` +
      `${compilation.compilerVersion}, optimizer ${settings.optimizer.runs} runs, via-IR, ` +
      `evm ${settings.evmVersion}, no metadata hash.`,
    "",
    "export const permit2Abi = [",
    compilation.abi.map((entry) => `  ${JSON.stringify(entry)}`).join(",\n"),
    "] as const",
    "",
    "/** Runtime code with its immutables zero: fill them (src/chain/Permit2.ts) before placing it. */",
    `export const permit2RuntimeBytecode: \`0x\${string}\` =`,
    `  "${compilation.runtimeBytecode}"`,
    "",
    "/** Byte ranges of the immutables in the runtime code, by variable name (Permit2's EIP712.sol). */",
    `export const permit2Immutables = ${JSON.stringify(compilation.immutables)} as const`,
    ""
  ].join("\n")
