-- wrk script for scripts/bench: GET /orders from 10,000 customers in turn, each named by
-- the x-customer-id header that the orders limiter keys on.
local customers = 10000
local requests = {}
local next_customer = 0

function init(args)
   for i = 1, customers do
      requests[i] = wrk.format("GET", "/orders", { ["x-customer-id"] = string.format("customer-%05d", i) })
   end
end

function request()
   next_customer = next_customer % customers + 1
   return requests[next_customer]
end
