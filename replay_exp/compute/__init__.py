"""The compute currencies: the ledger of a run (``ledger``), the paper's cost formulas
(``costmodel``), and the modelled GPU timing (``lengthmodel``, ``gencost``). Importing the
package imports none of them (``costmodel`` and ``lengthmodel`` are torch-free)."""
