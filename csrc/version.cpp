#include "ops.h"

namespace kog {

int64_t version() { return 5; }

}  // namespace kog
