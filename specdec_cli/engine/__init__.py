"""The decoding engine, independent of any method: the loop (``loop``: propose, verify, roll back, learn), draft
trees and their selection (``trees``), the draft budget (``budget``), verification (``verify``: rejection sampling
and the exact tree walk), sampling and the metrics."""
