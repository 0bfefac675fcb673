import { Effect } from "effect"
import {
  type Address,
  erc20Abi,
  type Hex,
  hashTypedData,
  type LocalAccount,
  type PublicClient,
  parseErc6492Signature,
  recoverTypedDataAddress
} from "viem"
import { uptoProxyAbi } from "./artifacts.ts"
import { ChainError, viemCall } from "./ChainError.ts"
import { PERMIT2_ADDRESS, permit2Domain, UPTO_PROXY_ADDRESS } from "./Permit2.ts"
import { permit2Abi } from "./permit2Artifact.ts"
import { signedBy } from "./SignerKeys.ts"

/**
 * The EIP-712 types of an x402 `upto` authorization, exactly as the official client signs them
 * (`uptoPermit2WitnessTypes` of `@x402/evm`): Permit2's `PermitWitnessTransferFrom` with the witness
 * `Witness(address to,address facilitator,uint256 validAfter)`, under `permit2Domain(chainId)`.
 */
export const uptoPermitTypes = {
  PermitWitnessTransferFrom: [
    { name: "permitted", type: "TokenPermissions" },
    { name: "spender", type: "address" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
    { name: "witness", type: "Witness" }
  ],
  TokenPermissions: [
    { name: "token", type: "address" },
    { name: "amount", type: "uint256" }
  ],
  Witness: [
    { name: "to", type: "address" },
    { name: "facilitator", type: "address" },
    { name: "validAfter", type: "uint256" }
  ]
} as const

/** An `upto` authorization (the wire's `permit2Authorization` with numbers decoded) and its signature. */
export interface UptoPermit {
  readonly from: Address
  /** The token and the ceiling: the most the facilitator may settle. */
  readonly permitted: { readonly token: Address; readonly amount: bigint }
  /** Must be the upto proxy: Permit2 hashes its caller in as the spender. */
  readonly spender: Address
  /** Permit2's unordered nonce: any unused 256-bit value, spent by the settlement. */
  readonly nonce: bigint
  /** Unix seconds; Permit2 refuses the transfer after it. */
  readonly deadline: bigint
  readonly witness: { readonly to: Address; readonly facilitator: Address; readonly validAfter: bigint }
  readonly signature: Hex
}

export type UptoPermitFields = Omit<UptoPermit, "signature">

/** The typed data the payer signs. */
export const uptoPermitTypedData = (chainId: number, permit: UptoPermitFields) =>
  ({
    domain: permit2Domain(chainId),
    types: uptoPermitTypes,
    primaryType: "PermitWitnessTransferFrom",
    message: {
      permitted: permit.permitted,
      spender: permit.spender,
      nonce: permit.nonce,
      deadline: permit.deadline,
      witness: permit.witness
    }
  }) as const

/** Signs as the official client does. A plain Promise: for tests and demo scripts, not the router. */
export const signUptoPermit = (
  account: LocalAccount,
  chainId: number,
  permit: UptoPermitFields
): Promise<Hex> => account.signTypedData(uptoPermitTypedData(chainId, permit))

/**
 * Whether `permit.signature` is `permit.from`'s EOA signature over the authorization. A malformed signature is
 * `false`. Contract wallets (ERC-1271, ERC-6492) are not recognized here: simulate the settlement for those.
 */
export const verifyUptoPermitSignature = (chainId: number, permit: UptoPermit): Effect.Effect<boolean> =>
  // The same check as an `exact` authorization's (`signedBy`: a recovery in libsecp256k1, D431).
  Effect.tryPromise(() =>
    signedBy(permit.from, hashTypedData(uptoPermitTypedData(chainId, permit)), permit.signature)
  ).pipe(Effect.orElseSucceed(() => false))

/** The EOA that signed the authorization; `Invalid` when the signature cannot be recovered. */
export const recoverUptoPermitSigner = (
  chainId: number,
  permit: UptoPermit
): Effect.Effect<Address, ChainError> =>
  Effect.tryPromise({
    try: () =>
      recoverTypedDataAddress({ signature: permit.signature, ...uptoPermitTypedData(chainId, permit) }),
    catch: (cause) =>
      new ChainError({ reason: "Invalid", message: "unrecoverable upto permit signature", cause })
  })

/** Where Permit2 keeps a nonce's bit: word `nonce >> 8` of `nonceBitmap(owner, word)`, bit `nonce & 0xff`. */
export const nonceBitmapPosition = (
  nonce: bigint
): { readonly wordPos: bigint; readonly bitPos: bigint } => ({
  wordPos: nonce >> 8n,
  bitPos: nonce & 0xffn
})

/** Whether Permit2 has spent `owner`'s `nonce` (settled, or invalidated by the owner). */
export const readPermit2NonceUsed = Effect.fn("UptoPermit.readNonceUsed")(function* (
  publicClient: PublicClient,
  owner: Address,
  nonce: bigint
) {
  const { wordPos, bitPos } = nonceBitmapPosition(nonce)
  const word = yield* viemCall("UptoPermit.readNonceUsed", () =>
    publicClient.readContract({
      address: PERMIT2_ADDRESS,
      abi: permit2Abi,
      functionName: "nonceBitmap",
      args: [owner, wordPos]
    })
  )
  return ((word >> bitPos) & 1n) === 1n
})

/** How much of `token` Permit2 may move for `owner`: the ERC-20 allowance owner → Permit2. */
export const readPermit2Allowance = Effect.fn("UptoPermit.readAllowance")(
  (publicClient: PublicClient, token: Address, owner: Address) =>
    viemCall("UptoPermit.readAllowance", () =>
      publicClient.readContract({
        address: token,
        abi: erc20Abi,
        functionName: "allowance",
        args: [owner, PERMIT2_ADDRESS]
      })
    )
)

type Permit2Error = Extract<(typeof permit2Abi)[number], { readonly type: "error" }>
const permit2Errors = permit2Abi.filter((entry): entry is Permit2Error => entry.type === "error")

/** The proxy's ABI plus Permit2's errors, so that a revert inside Permit2 is decoded by name (`InvalidNonce`). */
export const uptoSettleAbi = [...uptoProxyAbi, ...permit2Errors] as const

/**
 * The proxy call that settles `amount` (at most the ceiling) of the authorization, as the official facilitator
 * builds it (`buildUptoPermit2SettleArgs`): an ERC-6492 wrapper is taken off the signature. It must be sent by
 * `permit.witness.facilitator`. Usable with `simulateContract`, `writeContract` and `encodeFunctionData`.
 */
export const uptoSettleCall = (permit: UptoPermit, amount: bigint) =>
  ({
    address: UPTO_PROXY_ADDRESS,
    abi: uptoSettleAbi,
    functionName: "settle",
    args: [
      {
        permitted: { token: permit.permitted.token, amount: permit.permitted.amount },
        nonce: permit.nonce,
        deadline: permit.deadline
      },
      amount,
      permit.from,
      {
        to: permit.witness.to,
        facilitator: permit.witness.facilitator,
        validAfter: permit.witness.validAfter
      },
      parseErc6492Signature(permit.signature).signature
    ]
  }) as const
