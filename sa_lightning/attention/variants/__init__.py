"""One file per attention variant; importing this package registers each (in this order, which is the order
tables list them in). A new variant is a new file here and one line below.

The objects are importable by name (``variants.SWA``) for code that means one variant in particular (the
paper's comparisons: SA against SWA at equal w); such code writes ``SWA.name``, never the string.
"""
from .full import FULL
from .swa import SWA
from .sa import SA
from .sa_fixed import SA_FIXED  # fixed-σ SA
from .sa_swa import SA_SWA
from .moba import MOBA
from .sa_swa_union import SA_SWA_UNION
from .strided import STRIDED  # the controls
from .strided_swa import STRIDED_SWA
from .strided_swa_union import STRIDED_SWA_UNION
from .strided_local import STRIDED_LOCAL  # the deterministic control that reaches
from .strided_local_swa_union import STRIDED_LOCAL_SWA_UNION
from .strided_local_swa import STRIDED_LOCAL_SWA
from .random import RANDOM
from .random_swa import RANDOM_SWA
from .random_swa_union import RANDOM_SWA_UNION
from .sa_bucket import SA_BUCKET  # bucketed SA
from .sa_bucket_swa_union import SA_BUCKET_SWA_UNION
from .sa_bucket_swa import SA_BUCKET_SWA

__all__ = ["FULL", "SWA", "SA", "SA_FIXED", "SA_SWA", "MOBA", "SA_SWA_UNION", "STRIDED", "STRIDED_SWA", "STRIDED_SWA_UNION",
           "STRIDED_LOCAL", "STRIDED_LOCAL_SWA_UNION", "STRIDED_LOCAL_SWA",
           "RANDOM", "RANDOM_SWA", "RANDOM_SWA_UNION", "SA_BUCKET", "SA_BUCKET_SWA_UNION", "SA_BUCKET_SWA"]
