"""The provider chain: members tried in order, their answers checked, a shared breaker, the pair cache."""

from worker.chain.chain import Chain, ChainOutcome, Member, member_variable

__all__ = ["Chain", "ChainOutcome", "Member", "member_variable"]
