"""The replay theory: the paper's bound and design model (``bound``), the exact variance of
FIFO replay (``exact``), the noise estimators (``noise``) and their measurement on the
testbed (``measure``), and ``replay-exp-theory`` (``cli``). Importing the package imports
none of them."""
