// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice Write-once registry of epoch roots. The router signer that deploys it is the only writer; an epoch
/// is anchored at most once, so a published root can never be replaced. A zero root means "not anchored".
contract EpochAnchor {
    address public immutable owner;
    mapping(uint64 => bytes32) public roots;

    event EpochAnchored(uint64 indexed epochId, bytes32 root);

    constructor() {
        owner = msg.sender;
    }

    function anchor(uint64 epochId, bytes32 root) external {
        require(msg.sender == owner, "EpochAnchor: caller is not the owner");
        require(root != bytes32(0), "EpochAnchor: empty root");
        require(roots[epochId] == bytes32(0), "EpochAnchor: epoch already anchored");
        roots[epochId] = root;
        emit EpochAnchored(epochId, root);
    }
}
