#include "ops.h"
#include "version.h"

namespace kog {

int64_t version() { return KOG_OPS_VERSION; }

}  // namespace kog
