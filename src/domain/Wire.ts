import { Schema } from "effect"

/** Building blocks the wire schemas share. */

/** An optional field that may also be sent as `null`. */
export const optionalNullable = <S extends Schema.Top>(schema: S) => Schema.optionalKey(Schema.NullOr(schema))

/** The last member of a union of blocks, items or tools: anything else, kept by its `type` to be refused by name. */
export const Loose = Schema.Struct({ type: Schema.String })

export const Int = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  Schema.Int.check(Schema.isGreaterThanOrEqualTo(min), Schema.isLessThanOrEqualTo(max))

/** A wallet or contract address as sent: 0x and 20 bytes of hex, any letter case. */
export const WalletAddress = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]{40}$/, { message: "expected a 0x-prefixed 20-byte address" })
)

/** 32 bytes of 0x-prefixed hex (a nonce, a hash). */
export const Hex32 = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]{64}$/, { message: "expected 32 bytes of 0x-prefixed hex" })
)

/** A signature as sent: 0x hex (its length is the verifier's to judge). */
export const SignatureHex = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]+$/, { message: "expected 0x hex" })
)
