import { concat, type Hex, hashTypedData, keccak256 } from "viem"
import { type ReceiptBody, receiptTypedData } from "../domain/Receipt.ts"

/**
 * The epoch Merkle tree (docs/protocol.md section 3). Pure: no I/O, no clock.
 *
 * - leaf = keccak256(EIP-712 digest of the receipt), i.e. `keccak256(hashTypedData(typed_data))`. Hashing
 *   the 32-byte digest once more keeps a leaf from ever being read as an inner node (64-byte preimage).
 * - leaves are ordered by `request_id` (byte order), paired left to right level by level; an odd last
 *   node moves up unchanged (never duplicated).
 * - a pair hashes as OpenZeppelin's `MerkleProof` does: keccak256 of the two nodes, smaller first, so a
 *   proof is just the list of siblings and verifies without any left/right flags.
 */

const normalize = (node: Hex): Hex => node.toLowerCase() as Hex

/** OpenZeppelin's commutative pair hash. */
export const hashPair = (a: Hex, b: Hex): Hex => {
  const x = normalize(a)
  const y = normalize(b)
  return x < y ? keccak256(concat([x, y])) : keccak256(concat([y, x]))
}

/** The leaf of a receipt as signed for `chainId`. */
export const receiptLeaf = (receipt: ReceiptBody, chainId: number): Hex =>
  keccak256(hashTypedData(receiptTypedData(receipt, chainId)))

/** Byte order of ASCII request ids (not locale order, not Postgres collation). */
export const compareRequestIds = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0)

export interface MerkleTree {
  /** `levels[0]` are the leaves in order; the last level holds only the root. */
  readonly levels: ReadonlyArray<ReadonlyArray<Hex>>
  readonly root: Hex
}

/** Builds the tree over leaves already in epoch order. An empty epoch has no tree. */
export const buildTree = (leaves: ReadonlyArray<Hex>): MerkleTree | undefined => {
  if (leaves.length === 0) return undefined
  const levels: Array<ReadonlyArray<Hex>> = [leaves.map(normalize)]
  let level = levels[0]!
  while (level.length > 1) {
    const next: Array<Hex> = []
    for (let i = 0; i < level.length; i += 2) {
      next.push(i + 1 < level.length ? hashPair(level[i]!, level[i + 1]!) : level[i]!)
    }
    levels.push(next)
    level = next
  }
  return { levels, root: level[0]! }
}

/** The siblings from the leaf at `index` up to the root (levels where the node moved up alone add none). */
export const proofOf = (tree: MerkleTree, index: number): ReadonlyArray<Hex> => {
  const proof: Array<Hex> = []
  let position = index
  for (const level of tree.levels.slice(0, -1)) {
    const sibling = position % 2 === 0 ? position + 1 : position - 1
    if (sibling < level.length) proof.push(level[sibling]!)
    position = Math.floor(position / 2)
  }
  return proof
}

/** Folds a proof onto a leaf, as `MerkleProof.processProof` does. */
export const processProof = (leaf: Hex, proof: ReadonlyArray<Hex>): Hex =>
  proof.reduce<Hex>((node, sibling) => hashPair(node, sibling), normalize(leaf))

export const verifyProof = (leaf: Hex, proof: ReadonlyArray<Hex>, root: Hex): boolean =>
  processProof(leaf, proof) === normalize(root)
