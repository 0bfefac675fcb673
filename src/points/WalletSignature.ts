import { Effect } from "effect"
import { getAddress, type Hex, type TypedData, type TypedDataDefinition, verifyTypedData } from "viem"

/**
 * Whether `signature` is the wallet's EIP-712 signature over `definition` (an EOA signature, or an
 * ERC-1271 one viem can check offline). A malformed signature is simply not a signature: false.
 */
export const isSignedBy = <
  const T extends TypedData | Record<string, unknown>,
  P extends keyof T | "EIP712Domain"
>(
  definition: TypedDataDefinition<T, P>,
  wallet: string,
  signature: string
) =>
  Effect.tryPromise(() =>
    verifyTypedData({ ...definition, address: getAddress(wallet), signature: signature as Hex } as Parameters<
      typeof verifyTypedData
    >[0])
  ).pipe(Effect.orElseSucceed(() => false))
