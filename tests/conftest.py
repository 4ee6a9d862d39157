"""Session-wide test settings.

BLAS is capped at one thread (nn.threads explains why): several test processes
share two cores in CI, and results must not depend on a thread count.
"""

from nn.threads import set_threads

set_threads(1)
