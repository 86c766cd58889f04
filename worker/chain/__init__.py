"""The provider chain: members tried in order, their answers checked, a shared breaker, the pair cache."""

from kernel.settings import member_variable
from worker.chain.chain import Chain, ChainOutcome, Member

__all__ = ["Chain", "ChainOutcome", "Member", "member_variable"]
