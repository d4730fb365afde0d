#include "ops.h"

namespace kog {

int64_t version() { return 1; }

}  // namespace kog
