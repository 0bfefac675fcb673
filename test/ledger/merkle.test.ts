import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { concat, type Hex, hashTypedData, keccak256 } from "viem"
import { type ReceiptBody, receiptTypedData, receiptTypedDataJson } from "../../src/domain/Receipt.ts"
import {
  buildTree,
  compareRequestIds,
  hashPair,
  processProof,
  proofOf,
  receiptLeaf,
  verifyProof
} from "../../src/ledger/Merkle.ts"

const hex32 = fc.uint8Array({ minLength: 32, maxLength: 32 }).map((bytes) => keccak256(bytes))
const leafSets = fc.uniqueArray(hex32, { minLength: 1, maxLength: 40 })

/** OpenZeppelin's `Hashes.commutativeKeccak256`, written out independently of the module under test. */
const ozPair = (a: Hex, b: Hex) =>
  BigInt(a) < BigInt(b) ? keccak256(concat([a, b])) : keccak256(concat([b, a]))
const ozProcessProof = (leaf: Hex, proof: ReadonlyArray<Hex>) => proof.reduce<Hex>(ozPair, leaf)

/** Flips one byte of a 32-byte hash. */
const tamper = (node: Hex, at: number): Hex => {
  const i = 2 + 2 * (at % 32)
  const byte = (Number.parseInt(node.slice(i, i + 2), 16) ^ 0xff).toString(16).padStart(2, "0")
  return `${node.slice(0, i)}${byte}${node.slice(i + 2)}` as Hex
}

describe("epoch Merkle tree (properties)", () => {
  it("every leaf's proof folds to the root, also with OpenZeppelin's processProof", () => {
    fc.assert(
      fc.property(leafSets, (leaves) => {
        const tree = buildTree(leaves)!
        leaves.forEach((leaf, i) => {
          const proof = proofOf(tree, i)
          assert.isTrue(verifyProof(leaf, proof, tree.root))
          assert.strictEqual(ozProcessProof(leaf, proof), tree.root)
          // A proof is at most the tree's height.
          assert.isAtMost(proof.length, Math.ceil(Math.log2(leaves.length)))
        })
      })
    )
  })

  it("a tampered leaf does not verify with the original proof", () => {
    fc.assert(
      fc.property(leafSets, fc.nat(), fc.nat(), (leaves, pick, at) => {
        const tree = buildTree(leaves)!
        const i = pick % leaves.length
        assert.isFalse(verifyProof(tamper(leaves[i]!, at), proofOf(tree, i), tree.root))
      })
    )
  })

  it("a tampered, truncated, extended or reordered proof does not verify", () => {
    fc.assert(
      fc.property(
        leafSets.filter((l) => l.length >= 2),
        fc.nat(),
        fc.nat(),
        hex32,
        (leaves, pick, at, extra) => {
          const tree = buildTree(leaves)!
          const i = pick % leaves.length
          const proof = proofOf(tree, i)
          const j = at % proof.length
          const tampered = proof.map((p, k) => (k === j ? tamper(p, at) : p))
          assert.isFalse(verifyProof(leaves[i]!, tampered, tree.root))
          assert.isFalse(verifyProof(leaves[i]!, proof.slice(0, -1), tree.root))
          assert.isFalse(verifyProof(leaves[i]!, [...proof, extra], tree.root))
          if (proof.length >= 2 && proof[0] !== proof[1]) {
            assert.isFalse(verifyProof(leaves[i]!, [proof[1]!, proof[0]!, ...proof.slice(2)], tree.root))
          }
        }
      )
    )
  })

  it("a leaf that is not in the tree verifies with no proof of the tree", () => {
    fc.assert(
      fc.property(leafSets, hex32, (leaves, outsider) => {
        fc.pre(!leaves.includes(outsider))
        const tree = buildTree(leaves)!
        leaves.forEach((_, i) => {
          assert.isFalse(verifyProof(outsider, proofOf(tree, i), tree.root))
        })
      })
    )
  })

  it("the pair hash is commutative; one leaf is its own root; no leaves, no tree", () => {
    fc.assert(
      fc.property(hex32, hex32, (a, b) => {
        assert.strictEqual(hashPair(a, b), hashPair(b, a))
        assert.strictEqual(hashPair(a, b), ozPair(a, b))
      })
    )
    fc.assert(
      fc.property(hex32, (leaf) => {
        const tree = buildTree([leaf])!
        assert.strictEqual(tree.root, leaf)
        assert.deepStrictEqual(proofOf(tree, 0), [])
      })
    )
    assert.isUndefined(buildTree([]))
    assert.strictEqual(processProof(`0x${"AB".repeat(32)}`, []), `0x${"ab".repeat(32)}`)
  })

  it("request ids sort by bytes, not by locale", () => {
    assert.deepStrictEqual(["req_b", "REQ_c", "req_A", "req_a"].sort(compareRequestIds), [
      "REQ_c",
      "req_A",
      "req_a",
      "req_b"
    ])
  })
})

// The vector published in docs/protocol.md section 3.
const wallet = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
const first: ReceiptBody = {
  request_id: "req_0001",
  wallet,
  provider_id: "prov-a",
  model_class: "chat-medium",
  in_tokens: 1200,
  out_tokens: 300,
  cached_tokens: 0,
  price_in: 800000,
  price_out: 3200000,
  price_in_cached: null,
  charged: 1920,
  authorized: 5000,
  payment_ref: `0x${"11".repeat(32)}`,
  refund_ref: `balance:${wallet}`,
  ttft_ms: 250,
  status: "ok",
  settlement: "landed",
  epoch_id: 490000,
  session_id: null,
  quotes_competing: 3,
  created_at: 1764000000000
}
const second: ReceiptBody = {
  ...first,
  request_id: "req_0002",
  provider_id: "prov-b",
  in_tokens: 500,
  out_tokens: 100,
  price_in: 600000,
  price_out: 2400000,
  charged: 540,
  authorized: 2000,
  payment_ref: `0x${"22".repeat(32)}`,
  ttft_ms: 180,
  quotes_competing: 2,
  created_at: 1764000060000
}
const third: ReceiptBody = {
  ...first,
  request_id: "req_0003",
  in_tokens: 0,
  out_tokens: 0,
  charged: 0,
  authorized: 3000,
  payment_ref: "",
  refund_ref: null,
  ttft_ms: 0,
  status: "released",
  settlement: "none",
  created_at: 1764000120000
}
const vector = {
  digests: [
    "0x426fdebc1f1d0d48f99e27c6743095fc92a328011ded2f4209e4d3edcc845b8f",
    "0xf5202286e7ca7318055791bd9eee47977ba88bff48a071893bc218d6aedfd38c",
    "0xf4f96c9d9fa2fb5a90fdd79e4c563e0be0e09c8e13a2453f1690c4975ae575c1"
  ],
  leaves: [
    "0xe647ddbfaa47b9a17297d1ad9fcd5e283f105b85ed39011ae2a1f66307f45681",
    "0x2948d69ec79c3b0942917cdbd3eb02a8389e92d858db2c7d803da7f07bdc6441",
    "0x4c8ff1ef4f35db20ae4783b7877c6e7e20fd427680ff57ae95f2f10f26b441d2"
  ],
  inner: "0xfeee5fc50ef9ee3df78788225de62bd560845a25d6c2c0256dfdb817753e9eb1",
  root: "0xd3319c8e8d5b5af271e97d0dde9d767b0735f48a7e1de2c0d439c368bc6b3951"
} as const

describe("epoch root test vector (docs/protocol.md section 3)", () => {
  it("digests, leaves, root and proofs", () => {
    // Inserted out of order: the tree is built over request_id order.
    const receipts = [third, first, second].sort((a, b) => compareRequestIds(a.request_id, b.request_id))
    assert.deepStrictEqual(
      receipts.map((r) => hashTypedData(receiptTypedData(r, 31337))),
      [...vector.digests]
    )
    // A client holding only the JSON typed data (as GET /v1/receipts/:id returns it) gets the same leaf.
    const fromJson = receipts.map((r) =>
      keccak256(hashTypedData(receiptTypedDataJson(r, 31337) as Parameters<typeof hashTypedData>[0]))
    )
    assert.deepStrictEqual(fromJson, [...vector.leaves])
    assert.deepStrictEqual(
      receipts.map((r) => receiptLeaf(r, 31337)),
      [...vector.leaves]
    )
    const tree = buildTree(vector.leaves)!
    assert.strictEqual(tree.root, vector.root)
    assert.deepStrictEqual(proofOf(tree, 0), [vector.leaves[1], vector.leaves[2]])
    assert.deepStrictEqual(proofOf(tree, 1), [vector.leaves[0], vector.leaves[2]])
    assert.deepStrictEqual(proofOf(tree, 2), [vector.inner])
    assert.strictEqual(ozPair(vector.leaves[0], vector.leaves[1]), vector.inner)
    assert.strictEqual(ozPair(vector.inner, vector.leaves[2]), vector.root)
    // The same receipts on another chain are other leaves: the domain binds the chain id.
    assert.notStrictEqual(receiptLeaf(first, 8453), vector.leaves[0])
  })
})
