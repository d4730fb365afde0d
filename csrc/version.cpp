#include "ops.h"

namespace kog {

int64_t version() { return 4; }

}  // namespace kog
